"""Data of test_keras_data_order.py (Keras on the TensorFlow backend): ``cases()``, run in the
TensorFlow child of ``tests/tf_process.py``; ``python tests/tfdata/keras_order_child.py`` prints it alone.

For each case, trains a seeded model plain and then under the full nndoctor installation, and
records what the model itself saw: a layer adds each training batch's sample ids into an
order-sensitive checksum (int64 variables written inside the compiled step). Prints one JSON
line: per case, the (batches, samples, id sum, checksum) of both runs, whether the weights are
bit-identical, the K106 fetches nndoctor timed, and internal errors."""
import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SAMPLES, BATCH = 200, 16  # 13 batches per pass, the last one partial


class SeenIds(keras.layers.Layer):
    """Passes the features on; in training, folds the batch's ids (column 0) into a checksum."""

    def build(self, shape):
        self.seen = self.add_weight(shape=(4,), dtype="int64", initializer="zeros", trainable=False)

    def call(self, x, training=False):
        if training:
            ids = tf.cast(x[:, 0], tf.int64)
            weights = tf.range(1, tf.shape(ids)[0] + 1, dtype=tf.int64)
            old = self.seen
            self.seen.assign(tf.stack([old[0] + 1, old[1] + tf.size(ids, out_type=tf.int64),
                                       old[2] + tf.reduce_sum(ids),
                                       old[3] * 1000003 + tf.reduce_sum(ids * weights)]))
        return x[:, 1:]


def dataset(repeat: bool):
    ids = np.arange(SAMPLES, dtype="float32")
    rng = np.random.default_rng(0)
    x = np.concatenate([ids[:, None], rng.normal(size=(SAMPLES, 4)).astype("float32")], axis=1)
    y = rng.integers(0, 3, size=SAMPLES).astype("int64")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES, seed=1)
    if repeat:
        ds = ds.repeat()
    return ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)


CASES = {
    "epochs": dict(fit=dict(epochs=3)),
    "steps_per_epoch_repeat": dict(repeat=True, fit=dict(epochs=3, steps_per_epoch=5)),
    "steps_per_epoch_finite": dict(fit=dict(epochs=2, steps_per_epoch=6)),
    "steps_per_execution_3": dict(compile=dict(steps_per_execution=3), fit=dict(epochs=2)),
    "jit_compile_off": dict(compile=dict(jit_compile=False), fit=dict(epochs=2)),
    "run_eagerly": dict(compile=dict(run_eagerly=True), fit=dict(epochs=2)),
}


def train(case: dict) -> tuple[list[int], list[np.ndarray], keras.Model]:
    keras.utils.set_random_seed(0)
    seen = SeenIds()
    model = keras.Sequential([keras.Input((5,)), seen, keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  **case.get("compile", {}))
    model.fit(dataset(case.get("repeat", False)), verbose=0, **case["fit"])
    return [int(v) for v in seen.seen.numpy()], [w.numpy() for w in model.weights], model


def cases() -> dict:
    """Per case: what the model saw plain and under nndoctor, and what nndoctor timed."""
    from nndoctor.tfdata import instrument as tfdata_instrument

    observers = []
    original_init = tfdata_instrument.TfDataObserver.__init__

    def remember(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        observers.append(self)

    tfdata_instrument.TfDataObserver.__init__ = remember
    try:
        return _train_each_case(tfdata_instrument, observers)
    finally:
        tfdata_instrument.TfDataObserver.__init__ = original_init


def _train_each_case(tfdata_instrument, observers: list) -> dict:
    from nndoctor.core.engine import Session
    from nndoctor.instrument.extensions import install

    out = {}
    for name, case in CASES.items():
        plain, plain_weights, _ = train(case)
        session = Session(command=["keras_order_child"])
        installation = install(session)
        try:
            observed, observed_weights, model = train(case)
        finally:
            installation.uninstall()
        timed = [record.clock.fetches for record in observers[-1].records.values()] if observers else []
        # Keras's own outer tf.function of the observed model: traced only where nndoctor's did not replace it.
        keras_outer = tfdata_instrument._keras_outer(getattr(model.train_function, "__wrapped__", None))
        out[name] = {
            "plain": plain, "observed": observed, "timed_fetches": timed,
            "identical_weights": all(np.array_equal(a, b) for a, b in zip(plain_weights, observed_weights)),
            "internal_errors": [f"{e.where}: {e.error}" for e in session.report.internal_errors],
            "steps": session.step,
            "keras_outer_traces": keras_outer.experimental_get_tracing_count() if keras_outer else None,
        }
    return out


def main() -> None:
    print(json.dumps(cases()))


if __name__ == "__main__":
    sys.exit(main())
