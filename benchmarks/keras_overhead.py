"""Overhead of ``nndoctor run`` on Keras 3 ``fit`` (TensorFlow backend, CPU), measured side by side.

One process, TensorFlow imported once: each round trains a fresh model plain, then a fresh model
under the full nndoctor instrumentation (the same installation ``nndoctor run`` makes: Keras and
tf.data patches, every check enabled), in alternating order; each fit is timed whole (tracing
included, as the user pays it). Prints the median plain and observed seconds and their ratio
(target ≤ 1.10), and writes the JSON with ``--json``.

    KERAS_BACKEND=tensorflow python benchmarks/keras_overhead.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build_data(tf, samples: int, batch: int):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 64)).astype("float32")
    y = rng.integers(0, 10, size=(samples,)).astype("int64")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(samples, seed=0)
    return ds.map(lambda a, b: (a * 0.5, b), num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(
        tf.data.AUTOTUNE)


def train(keras, ds, epochs: int) -> float:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    start = time.perf_counter()
    model.fit(ds, epochs=epochs, verbose=0)
    return time.perf_counter() - start


def observed(keras, ds, epochs: int) -> float:
    from nndoctor.engine import Session
    from nndoctor.instrument.extensions import install

    session = Session(command=["keras_overhead"])
    installation = install(session)
    try:
        return train(keras, ds, epochs)
    finally:
        installation.uninstall()
        assert not session.report.internal_errors, session.report.internal_errors


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    import keras
    import tensorflow as tf

    ds = build_data(tf, args.samples, args.batch)
    train(keras, ds, 1)  # warm-up: TensorFlow's one-time start-up costs out of both columns
    plain, watched = [], []
    for round_ in range(args.rounds):
        order = (("plain", plain), ("nndoctor", watched))
        for name, times in order if round_ % 2 == 0 else reversed(order):
            times.append((train if name == "plain" else observed)(keras, ds, args.epochs))
    result = {
        "backend": keras.config.backend(), "tensorflow": tf.__version__, "keras": keras.__version__,
        "cpu_threads": os.cpu_count(), "rounds": args.rounds, "samples": args.samples, "batch": args.batch,
        "epochs": args.epochs, "steps_per_fit": args.epochs * -(-args.samples // args.batch),
        "plain_s": plain, "nndoctor_s": watched,
        "median_plain_s": statistics.median(plain), "median_nndoctor_s": statistics.median(watched),
    }
    result["ratio"] = result["median_nndoctor_s"] / result["median_plain_s"]
    print(f"Keras fit ({result['backend']} backend, CPU), {result['steps_per_fit']} steps per fit, "
          f"median of {args.rounds}: plain {result['median_plain_s']:.3f} s, nndoctor "
          f"{result['median_nndoctor_s']:.3f} s, ratio {result['ratio']:.3f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
