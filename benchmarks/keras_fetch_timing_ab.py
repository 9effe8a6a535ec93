"""In-process A/B of K106's compiled fetch timing on Keras ``fit`` (TensorFlow backend, CPU).

One process, rounds in rotating order, a fresh model each fit (``keras_overhead.py``'s model and
data): plain Keras; nndoctor with the fetch times returned as outputs of its own outer function
(``outputs``, the shipped path); nndoctor with the times written to its variables by Keras's own
traced function (``variables``, the fallback path, forced by making ``_own_outer`` give up).
In one process the run-to-run drift of a shared VM hits every kind alike.

    PYTHONPATH=src KERAS_BACKEND=tensorflow python benchmarks/keras_fetch_timing_ab.py 18
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    import keras
    import keras_overhead as ko
    import tensorflow as tf

    from nndoctor.tfdata import instrument

    own = instrument._own_outer
    ds = ko.build_data(tf, 8192, 64)

    def variables(keras, ds, epochs):
        instrument._own_outer = lambda function, observer: None
        try:
            return ko.observed(keras, ds, epochs)
        finally:
            instrument._own_outer = own

    kinds = {"plain": ko.train, "outputs": ko.observed, "variables": variables}
    for run in kinds.values():  # warm-up
        run(keras, ds, 1)
    times = {kind: {"wall": [], "cpu": []} for kind in kinds}
    orders = list(itertools.permutations(kinds))
    for round_ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 12):
        for kind in orders[round_ % len(orders)]:
            for clock, seconds in kinds[kind](keras, ds, 2).items():
                times[kind][clock].append(seconds)
    for clock in ("wall", "cpu"):
        plain = times["plain"][clock]
        print(clock, "  ".join(
            f"{kind} {statistics.median(v[clock]):.3f} s ({statistics.median(v[clock]) / statistics.median(plain):.3f}),"
            f" mean paired diff {statistics.mean(a - b for a, b in zip(v[clock], plain)):+.3f} s"
            for kind, v in times.items()))
    print("load average", os.getloadavg())


if __name__ == "__main__":
    main()
