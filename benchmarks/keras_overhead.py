"""Overhead of ``nndoctor run`` on Keras 3 ``fit`` (CPU), measured side by side.

One process, the framework imported once: each round trains a fresh model plain, then a fresh
model under the full nndoctor instrumentation (the same installation ``nndoctor run`` makes:
Keras and tf.data patches, every check enabled), in alternating order; each fit is timed whole
(tracing included, as the user pays it) on two clocks: wall time and the process's CPU time
(all threads; on a machine shared with other jobs it counts only this process's work).
A warm-up fit of each kind, not counted, takes the one-time costs (imports, first traces of
nndoctor's own code) out of both columns. Prints the median plain and observed seconds and
their ratio on each clock (target ≤ 1.10), and writes the JSON with ``--json``.

    KERAS_BACKEND=tensorflow python benchmarks/keras_overhead.py --rounds 5
    KERAS_BACKEND=tensorflow python benchmarks/keras_overhead.py --rounds 5 --clock cpu
    KERAS_BACKEND=torch python benchmarks/keras_overhead.py --rounds 5 --threads 1

The same ``tf.data`` pipeline feeds every backend (Keras iterates it eagerly off TensorFlow).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CLOCKS = ("wall", "cpu")


def build_data(tf, samples: int, batch: int):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 64)).astype("float32")
    y = rng.integers(0, 10, size=(samples,)).astype("int64")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(samples, seed=0)
    return ds.map(lambda a, b: (a * 0.5, b), num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(
        tf.data.AUTOTUNE)


def train(keras, ds, epochs: int) -> dict[str, float]:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    gc.collect()  # a full collection lands in neither column at random
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(ds, epochs=epochs, verbose=0)
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def observed(keras, ds, epochs: int) -> dict[str, float]:
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
    parser.add_argument("--clock", choices=CLOCKS, default="wall",
                        help="the clock of the headline ratio (both are measured and written): wall time, or "
                             "cpu: the process's CPU time over all threads, which time other jobs take from a "
                             "shared machine does not inflate")
    parser.add_argument("--threads", type=int,
                        help="intra-op threads of the backend (torch.set_num_threads / TensorFlow's intra- and "
                             "inter-op pools); default: the framework's own. On a shared machine the torch "
                             "backend's spinning OpenMP threads make whole fits vary 10x: use --threads 1 there")
    parser.add_argument("--json")
    args = parser.parse_args()
    import keras  # first: on the torch backend it imports torch, which crashes if TensorFlow came first

    if args.threads and keras.config.backend() == "torch":
        import torch

        torch.set_num_threads(args.threads)
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    ds = build_data(tf, args.samples, args.batch)
    train(keras, ds, 1)  # warm-up: the framework's one-time start-up costs out of both columns
    observed(keras, ds, 1)  # warm-up: nndoctor's imports and first traces likewise
    times: dict[str, dict[str, list[float]]] = {side: {c: [] for c in CLOCKS} for side in ("plain", "nndoctor")}
    started = time.perf_counter()
    for round_ in range(args.rounds):
        order = ("plain", "nndoctor") if round_ % 2 == 0 else ("nndoctor", "plain")
        for side in order:
            measured = (train if side == "plain" else observed)(keras, ds, args.epochs)
            for c in CLOCKS:
                times[side][c].append(measured[c])
    result = {
        "backend": keras.config.backend(), "tensorflow": tf.__version__, "keras": keras.__version__,
        "cpu_threads": os.cpu_count(), "threads": args.threads, "load_average": os.getloadavg(),
        "rounds": args.rounds,
        "samples": args.samples, "batch": args.batch, "epochs": args.epochs,
        "steps_per_fit": args.epochs * -(-args.samples // args.batch), "headline_clock": args.clock,
        "seconds_measuring": round(time.perf_counter() - started, 1),
    }
    for c in CLOCKS:
        plain, watched = statistics.median(times["plain"][c]), statistics.median(times["nndoctor"][c])
        result[c] = {"plain_s": times["plain"][c], "nndoctor_s": times["nndoctor"][c],
                     "median_plain_s": plain, "median_nndoctor_s": watched, "ratio": watched / plain}
    result["ratio"] = result[args.clock]["ratio"]
    print(f"Keras fit ({result['backend']} backend, CPU), {result['steps_per_fit']} steps per fit, "
          f"median of {args.rounds}:")
    for c in CLOCKS:
        entry = result[c]
        print(f"  {c:4s} clock: plain {entry['median_plain_s']:.3f} s, nndoctor {entry['median_nndoctor_s']:.3f} s, "
              f"ratio {entry['ratio']:.3f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
