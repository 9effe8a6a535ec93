"""Overhead of ``nndoctor run`` on Keras 3 ``fit``, measured side by side.

One process, the framework imported once: each round trains a fresh model plain, then a fresh
model under the full nndoctor instrumentation (the same installation ``nndoctor run`` makes:
Keras and tf.data patches, every check enabled), in alternating order; each fit is timed whole
(tracing included, as the user pays it) on two clocks: wall time and the process's CPU time
(all threads; on a machine shared with other jobs it counts only this process's work).
A warm-up fit of each kind, not counted, takes the one-time costs (imports, first traces of
nndoctor's own code) out of both columns. Prints the median plain and observed seconds and
their ratio on each clock (target ≤ 1.10 on CPU, ≤ 1.05 on a GPU), with a 95% bootstrap
interval of the wall-clock ratio (rounds resampled as pairs), and writes the JSON with ``--json``.

    KERAS_BACKEND=tensorflow python benchmarks/keras_overhead.py --rounds 5
    KERAS_BACKEND=tensorflow python benchmarks/keras_overhead.py --rounds 5 --clock cpu
    KERAS_BACKEND=torch python benchmarks/keras_overhead.py --rounds 5 --threads 1
    KERAS_BACKEND=torch python benchmarks/keras_overhead.py --data numpy --model cnn --rounds 7  # GPU, no TensorFlow

``--data tfdata`` (the default) feeds a shuffled, mapped, prefetched ``tf.data`` pipeline (on the
torch backend Keras iterates it eagerly); ``--data numpy`` gives ``fit`` NumPy arrays (Keras's own
batching and shuffling), and needs no TensorFlow. ``--model mlp`` is a 3-layer MLP on 64 features;
``--model cnn`` a small convolutional network (three Conv-BatchNorm-ReLU blocks) on 32×32×3 images,
the kind of step a GPU is busy with. Keras's torch backend trains on the GPU when one is visible.
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


INPUT_SHAPES = {"mlp": (64,), "cnn": (32, 32, 3)}


def arrays(samples: int, model: str = "mlp"):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, *INPUT_SHAPES[model])).astype("float32")
    y = rng.integers(0, 10, size=(samples,)).astype("int64")
    return x, y


def build_data(tf, samples: int, batch: int, model: str = "mlp"):
    x, y = arrays(samples, model)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(samples, seed=0)
    return ds.map(lambda a, b: (a * 0.5, b), num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(
        tf.data.AUTOTUNE)


class NumpyData:
    """``fit(x, y, batch_size=…)``: Keras batches and shuffles the arrays itself."""

    def __init__(self, samples: int, batch: int, model: str) -> None:
        self.x, self.y = arrays(samples, model)
        self.batch = batch


def build_model(keras, kind: str):
    layers = keras.layers
    if kind == "mlp":
        body = [layers.Dense(256, activation="relu"), layers.Dense(256, activation="relu")]
    else:
        body = []
        for width in (64, 128, 256):
            body += [layers.Conv2D(width, 3, padding="same", use_bias=False), layers.BatchNormalization(),
                     layers.ReLU(), layers.MaxPooling2D()]
        body.append(layers.GlobalAveragePooling2D())
    return keras.Sequential([keras.Input(INPUT_SHAPES[kind]), *body, layers.Dense(10)])


MODEL = "mlp"  # set by main()


def train(keras, ds, epochs: int) -> dict[str, float]:
    keras.utils.set_random_seed(0)
    model = build_model(keras, MODEL)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    gc.collect()  # a full collection lands in neither column at random
    wall, cpu = time.perf_counter(), time.process_time()
    if isinstance(ds, NumpyData):
        model.fit(ds.x, ds.y, batch_size=ds.batch, epochs=epochs, verbose=0)
    else:
        model.fit(ds, epochs=epochs, verbose=0)
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def bootstrap_ratio(plain: list[float], watched: list[float], resamples: int = 4000) -> tuple[float, float]:
    """95% interval of median(watched) / median(plain), the rounds resampled as pairs (a round's
    two fits ran back to back, under the same machine state)."""
    import numpy as np

    rng = np.random.default_rng(12345)  # the benchmark's own generator: no training RNG is touched
    p, w = np.asarray(plain), np.asarray(watched)
    picks = rng.integers(0, len(p), size=(resamples, len(p)))
    ratios = np.median(w[picks], axis=1) / np.median(p[picks], axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def observed(keras, ds, epochs: int) -> dict[str, float]:
    from nndoctor.core.engine import Session
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
    parser.add_argument("--data", choices=("tfdata", "numpy"), default="tfdata")
    parser.add_argument("--model", choices=tuple(INPUT_SHAPES), default="mlp")
    parser.add_argument("--image-size", type=int, default=32, help="the CNN's input side (images are N×S×S×3)")
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
    global MODEL
    MODEL = args.model
    INPUT_SHAPES["cnn"] = (args.image_size, args.image_size, 3)
    import keras  # first: on the torch backend it imports torch, which crashes if TensorFlow came first

    device = "CPU"
    if keras.config.backend() == "torch":
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        if torch.cuda.is_available():
            device = torch.cuda.get_device_name()
    tf = None
    if args.data == "tfdata" or keras.config.backend() == "tensorflow":
        import tensorflow as tf

        if args.threads:
            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
            tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        gpus = tf.config.list_physical_devices("GPU") if keras.config.backend() == "tensorflow" else []
        if gpus:
            device = f"{len(gpus)} GPU(s), TensorFlow"

    ds = build_data(tf, args.samples, args.batch, args.model) if args.data == "tfdata" else \
        NumpyData(args.samples, args.batch, args.model)
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
        "backend": keras.config.backend(), "tensorflow": tf.__version__ if tf is not None else None,
        "keras": keras.__version__, "device": device, "data": args.data, "model": args.model,
        "input_shape": INPUT_SHAPES[args.model],
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
        result[c]["ratio_95_interval"] = bootstrap_ratio(times["plain"][c], times["nndoctor"][c])
    result["ratio"] = result[args.clock]["ratio"]
    print(f"Keras fit ({result['backend']} backend, {device}, {args.model}, {args.data}), "
          f"{result['steps_per_fit']} steps per fit, median of {args.rounds}:")
    for c in CLOCKS:
        entry = result[c]
        print(f"  {c:4s} clock: plain {entry['median_plain_s']:.3f} s, nndoctor {entry['median_nndoctor_s']:.3f} s, "
              f"ratio {entry['ratio']:.3f} (95% interval {entry['ratio_95_interval'][0]:.3f}–"
              f"{entry['ratio_95_interval'][1]:.3f})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
