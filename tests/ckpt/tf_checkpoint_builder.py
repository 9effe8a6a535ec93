"""Writes the TensorFlow checkpoints and SavedModels that tests/ckpt/test_tf_checkpoint.py reads.

Run once per test session in a subprocess (the TensorFlow child of ``tests/tf_process.py``;
alone: ``python -m tests.ckpt.tf_checkpoint_builder OUT``): the test session imports Keras on its
torch backend, and TensorFlow's import takes seconds.
Besides the files it writes what TensorFlow itself reads back from them (``expected.npz``,
through ``tf.train.load_checkpoint``) and the Keras outputs that a conversion must reproduce,
so that the tests compare nndoctor's own bundle reader with TensorFlow's.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers  # noqa: E402


def cnn(head: int = 3, extra: bool = False) -> keras.Model:
    """The architecture of tests/ckpt/fixtures/keras_pairs.py:keras_cnn (TorchCnn's twin);
    ``head`` output units, ``extra``: one more Dense layer after the head."""
    body = [layers.Conv2D(4, 3), layers.BatchNormalization(epsilon=1e-3), layers.ReLU(), layers.Flatten(),
            layers.Dense(head)]
    if extra:
        body.append(layers.Dense(2))
    model = keras.Sequential([keras.Input((6, 6, 3)), *body])
    rng = np.random.default_rng(0)
    weights = []
    for variable in model.weights:
        value = rng.standard_normal(tuple(variable.shape)).astype("float32") * 0.5
        weights.append(np.abs(value) + 0.5 if "variance" in variable.path else value)
    model.set_weights(weights)
    return model


class Guarded(tf.Module):
    """A SavedModel whose only function raises when it runs: inspecting must not run it."""

    def __init__(self) -> None:
        super().__init__()
        self.weights_f32 = tf.Variable(np.arange(6, dtype="float32").reshape(2, 3))
        self.steps = tf.Variable(np.array([3, -4], dtype="int64"))
        self.half = tf.Variable(np.array([0.5, -1.25], dtype="float16"))
        self.brain = tf.Variable(tf.constant([1.5, -2.0, 3.0], dtype=tf.bfloat16))
        self.flags = tf.Variable(np.array([True, False]))

    @tf.function(input_signature=[tf.TensorSpec((None, 3), tf.float32)])
    def __call__(self, x):
        tf.debugging.assert_less(tf.reduce_sum(x), -1e30, message="this SavedModel must never run")
        return tf.matmul(x, self.weights_f32, transpose_b=True)


def expected_values(prefix: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(prefix)
    out = {}
    for key, dtype in reader.get_variable_to_dtype_map().items():
        if dtype == tf.string:
            continue
        value = reader.get_tensor(key)
        out[key] = np.asarray(value, dtype=np.float32) if dtype == tf.bfloat16 else np.asarray(value)
    return out


def main(out: str) -> None:
    manifest: dict[str, object] = {}
    expected: dict[str, np.ndarray] = {}

    model = cnn()
    optimizer = keras.optimizers.Adam(learning_rate=0.01)
    model.compile(optimizer=optimizer, loss="mse")
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer),
                                         os.path.join(out, "cnn"), max_to_keep=3)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 6, 6, 3)).astype("float32")
    y = rng.standard_normal((8, 3)).astype("float32")
    model.train_on_batch(x, y)
    first = manager.save()
    model.train_on_batch(x, y)
    second = manager.save()
    manifest["cnn_first"], manifest["cnn_second"] = first, second
    probe = rng.standard_normal((2, 6, 6, 3)).astype("float32")
    np.save(os.path.join(out, "cnn_input.npy"), probe)
    np.save(os.path.join(out, "cnn_output.npy"), np.asarray(model(probe, training=False)))
    manifest["cnn_paths"] = {v.path: list(v.shape) for v in model.weights}
    model.export(os.path.join(out, "cnn_saved"), verbose=False)

    manifest["wide"] = tf.train.Checkpoint(model=cnn(head=5)).write(os.path.join(out, "wide", "ckpt"))
    manifest["deeper"] = tf.train.Checkpoint(model=cnn(extra=True)).write(os.path.join(out, "deeper", "ckpt"))

    guarded = Guarded()
    saved = os.path.join(out, "guarded_saved")
    tf.saved_model.save(guarded, saved)
    try:
        tf.saved_model.load(saved)(tf.ones((1, 3)))
        manifest["guarded_raises"] = False
    except tf.errors.InvalidArgumentError as error:
        manifest["guarded_raises"] = "must never run" in str(error)

    for name, prefix in (("first", first), ("second", second), ("wide", manifest["wide"]),
                         ("deeper", manifest["deeper"]),
                         ("guarded", os.path.join(saved, "variables", "variables")),
                         ("cnn_saved", os.path.join(out, "cnn_saved", "variables", "variables"))):
        for key, value in expected_values(str(prefix)).items():
            expected[f"{name}|{key}"] = value
    np.savez(os.path.join(out, "expected.npz"), **expected)
    with open(os.path.join(out, "manifest.json"), "w") as handle:
        json.dump(manifest, handle)


if __name__ == "__main__":
    main(sys.argv[1])
