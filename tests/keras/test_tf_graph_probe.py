"""The TensorFlow graph probe (``keras/tf_graph_probe.py``) against ``facts.summarize``: the same
summary of a batch, whether read from NumPy after the fact or written by a traced step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nndoctor.keras.facts import summarize
from tests.conftest import IN_PROCESS_TENSORFLOW

pytestmark = IN_PROCESS_TENSORFLOW

RNG = np.random.default_rng(0)
BATCHES = {
    "floats": RNG.normal(size=(32, 6)).astype("float32"),
    "int_labels": RNG.integers(0, 7, size=(40,)).astype("int64"),
    "one_hot": np.eye(5, dtype="float32")[RNG.integers(0, 5, size=24)],
    "softmax": (lambda z: (np.exp(z) / np.exp(z).sum(-1, keepdims=True)).astype("float32"))(RNG.normal(size=(16, 4))),
    "pixels": RNG.integers(0, 256, size=(300, 4, 4, 3)).astype("uint8"),  # more rows than MAX_ROWS
    "with_nan": np.array([[0.0, 1.0], [np.nan, 1.0], [1.0, 0.0]], "float32"),
    "with_inf": np.array([[2.0, -np.inf], [3.0, 1.0]], "float64"),
    "bools": RNG.integers(0, 2, size=(10, 3)).astype(bool),
}


def probed(array: np.ndarray, spec_shape: tuple, name: str = "y_pred") -> object:
    import tensorflow as tf

    from nndoctor.keras.tf_graph_probe import GraphProbe

    probe = GraphProbe()
    assert probe.read("y_pred") is None  # nothing written yet

    @tf.function(input_signature=[tf.TensorSpec(spec_shape, tf.as_dtype(array.dtype))])
    def step(batch):
        probe.record({name: batch})
        return tf.constant(0)

    step(tf.constant(array))
    return probe.read(name)


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_probe_summary_matches_numpy_summary(name):
    array = BATCHES[name]
    expected = summarize(array)
    for spec_shape in ((None, *array.shape[1:]), (None,) * array.ndim):  # known and unknown row sizes
        got = probed(array, spec_shape)
        # Rows as run; the other dimensions as traced (-1: unknown when the step was traced).
        assert got.shape == (expected.shape[0], *(-1 if d is None else d for d in spec_shape[1:]))
        assert (got.integer_valued, got.binary_valued, got.dtype) == \
            (expected.integer_valued, expected.binary_valued, expected.dtype)
        assert got.min == pytest.approx(expected.min) and got.max == pytest.approx(expected.max)
        if math.isinf(expected.row_sum_deviation):
            assert math.isinf(got.row_sum_deviation)
        else:
            assert got.row_sum_deviation == pytest.approx(expected.row_sum_deviation, abs=1e-5)


def test_inputs_values_are_read_for_images_only():
    flat = probed(BATCHES["floats"], (None, 6), name="x")
    assert flat.shape == (-1, 6) and flat.dtype == "float32" and not flat.has_values
    image = probed(BATCHES["pixels"], (None, 4, 4, 3), name="x")
    assert image.has_values and image.shape == (256, 4, 4, 3) and image.max == BATCHES["pixels"][:256].max()
