"""Keras ``fit`` on the TensorFlow backend sees the same batches, in the same order, with and
without nndoctor (whose compiled train function times its tf.data fetches, K106): across
epochs, with ``steps_per_epoch`` below the dataset (finite or ``repeat()``), with
``steps_per_execution > 1``, with and without XLA (``jit_compile``), and with ``run_eagerly``.
One subprocess (Keras fixes its backend at import; this session imports it on torch): the
TensorFlow child shared with the other modules of ``tests/tf_process.py``."""

from __future__ import annotations

import pytest

from tests import tf_process
from tests.conftest import needs

# One worker runs the shared TensorFlow child, not each (tests/conftest.py: pytest -n distributes by group).
pytestmark = [needs("tensorflow"), pytest.mark.xdist_group(tf_process.GROUP)]



@pytest.fixture(scope="module")
def cases(request):
    return tf_process.read_json(request, "data_order")


BATCHES = {"epochs": 3 * 13, "steps_per_epoch_repeat": 15, "steps_per_epoch_finite": 12,
           "steps_per_execution_3": 2 * 13, "jit_compile_off": 2 * 13, "run_eagerly": 2 * 13}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BATCHES))
def test_model_sees_the_same_batches_in_the_same_order(cases, name):
    case = cases[name]
    assert not case["internal_errors"], case["internal_errors"]
    assert case["observed"] == case["plain"]  # batches, samples, id sum, order-sensitive checksum
    assert case["plain"][0] == BATCHES[name] and case["identical_weights"]
    # Steps counted once per train-function call: 2 epochs of ceil(13 / 3) calls with steps_per_execution=3.
    assert case["steps"] == (10 if name == "steps_per_execution_3" else BATCHES[name])


@pytest.mark.slow
def test_fetches_are_timed_on_the_compiled_and_the_eager_path(cases):
    for name in ("epochs", "steps_per_epoch_repeat", "steps_per_epoch_finite", "jit_compile_off", "run_eagerly"):
        assert sum(cases[name]["timed_fetches"]) >= BATCHES[name], (name, cases[name]["timed_fetches"])


@pytest.mark.slow
def test_keras_outer_function_is_replaced_not_traced_beside_nndoctors(cases):
    # nndoctor runs its own tf.function of Keras's multi_step_on_iterator (the times as outputs):
    # Keras's own is never traced, so the compiled step is traced and compiled once, as plain.
    for name in ("epochs", "steps_per_epoch_repeat", "steps_per_epoch_finite", "jit_compile_off"):
        assert cases[name]["keras_outer_traces"] == 0, (name, cases[name]["keras_outer_traces"])
    assert cases["steps_per_execution_3"]["keras_outer_traces"] >= 1  # left to Keras
