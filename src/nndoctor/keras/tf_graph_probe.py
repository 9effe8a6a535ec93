"""Batch statistics out of a TensorFlow graph without changing it.

On the TensorFlow backend ``fit``/``evaluate`` trace the train/test step into a graph once;
Python sees only symbolic tensors there. The probe adds a few read-only reductions (min,
max, integrality, row sums over at most ``MAX_ROWS`` rows) of x, y and the predictions and
writes them into nndoctor's own variable, which is read after the call. Nothing the
model computes reads them back, so the user's numbers are unchanged; variable writes are
XLA-compatible, unlike ``tf.py_function``.
"""

from __future__ import annotations

import math
from typing import Any

from nndoctor.keras.facts import MAX_ROWS, ArraySummary

# What the traced step writes, in this order: the minima over the rows of five per-value
# quantities (so one reduction computes them all), then the row-sum deviation and the size.
# Before the first write every field is -1 (a size is never negative).
_FIELDS = ("min", "neg_max", "integer", "binary", "finite", "row_sum_deviation", "size")
TENSORS = ("x", "y", "y_pred")


def is_symbolic(value: Any) -> bool:
    """A tensor of a graph being traced (its shape may be known, its values are not)."""
    return type(value).__name__ in ("SymbolicTensor", "KerasTensor")


def static_shape(value: Any) -> tuple[int, ...]:
    """The traced shape, -1 for the dimensions only known at run time (the batch)."""
    return tuple(-1 if d is None else int(d) for d in value.shape)


class GraphProbe:
    """nndoctor's variable for one model and phase, written by the traced step."""

    def __init__(self) -> None:
        import tensorflow as tf

        # One variable for all the tensors: each variable an XLA-compiled step updates costs
        # compile time of its own (measured: ~35 ms each on a 2-core CPU).
        self.variable = tf.Variable(tf.fill([len(TENSORS), len(_FIELDS)], tf.constant(-1.0, tf.float64)),
                                    trainable=False, name="nndoctor_batch_statistics")
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}
        self.shape_only: dict[str, tuple[tuple[int, ...], str]] = {}  # traced, values not read

    def record(self, tensors: dict[str, Any]) -> None:
        """Inside the trace: add the reductions of ``tensors[name]`` for each of ``TENSORS`` and
        one write of them all to our variable (a tensor that cannot be summarised writes -1s).

        The inputs' values are read only when they are image-shaped (rank ≥ 4): no check reads
        the values of other inputs (D101 reads image ranges, K108 only shapes), and each tensor
        probed costs compile time at every ``fit`` (measured: ~55 ms per tensor with XLA on a
        2-core CPU). Other inputs keep their traced shape and dtype."""
        import tensorflow as tf

        x = tensors.get("x")
        rank = getattr(getattr(x, "shape", None), "rank", None)
        if isinstance(x, tf.Tensor) and rank is not None and rank < 4:
            self.shape_only["x"] = (static_shape(x), x.dtype.name)

        rows = [None if name in self.shape_only else self._statistics(name, tensors.get(name))
                for name in TENSORS]
        if any(row is not None for row in rows):
            blank = tf.fill([len(_FIELDS)], tf.constant(-1.0, tf.float64))
            self.variable.assign(tf.stack([blank if row is None else row for row in rows]))

    def _statistics(self, name: str, tensor: Any) -> Any:
        """The reductions of one tensor, in ``_FIELDS`` order (None: not a numeric tensor).

        Few ops on purpose (about 30): each one is traced, and compiled by XLA with the step
        (``jit_compile``), at every ``fit``. Integrality and 0/1 values are judged on the finite
        values only, as ``facts.summarize`` does on arrays."""
        import tensorflow as tf

        if not isinstance(tensor, tf.Tensor) or tensor.shape.rank is None or tensor.shape.rank == 0:
            return None
        if not (tensor.dtype.is_floating or tensor.dtype.is_integer or tensor.dtype.is_bool):
            return None
        self.shapes[name] = static_shape(tensor)
        self.dtypes[name] = tensor.dtype.name
        rows = tf.cast(tensor[:MAX_ROWS], tf.float64)
        finite = tf.math.is_finite(rows)
        inf = tf.constant(math.inf, tf.float64)
        clean = tf.where(finite, rows, tf.constant(0.0, tf.float64))
        per_value = tf.stack([
            tf.where(finite, rows, inf),  # min
            tf.where(finite, -rows, inf),  # -max
            tf.cast(tf.equal(clean, tf.round(clean)), tf.float64),  # integer-valued
            tf.cast(tf.equal(clean, tf.cast(tf.cast(clean, tf.bool), tf.float64)), tf.float64),  # 0 or 1
            tf.cast(finite, tf.float64),
        ])
        minima = tf.reduce_min(per_value, axis=list(range(1, tensor.shape.rank + 1)))
        deviation = tf.reduce_max(tf.abs(tf.reduce_sum(rows, axis=-1) - 1))  # non-finite: see read()
        if any(d < 0 for d in self.shapes[name][1:]):  # a row's size known at run time only: count the rows
            size = tf.cast(tf.shape(rows, out_type=tf.int64)[0], tf.float64)
        else:
            size = tf.cast(tf.size(rows, out_type=tf.int64), tf.float64)
        return tf.concat([minima, tf.stack([deviation, size])], axis=0)

    def read(self, name: str) -> ArraySummary | None:
        """The statistics the last executed step wrote (None before any step ran)."""
        if name in self.shape_only:
            traced, dtype = self.shape_only[name]
            nan = math.nan
            return ArraySummary(traced, nan, nan, False, False, nan, dtype=dtype, has_values=False)
        written = self.variable.numpy()[TENSORS.index(name)]
        values = dict(zip(_FIELDS, (float(v) for v in written), strict=True))
        shape = self.shapes.get(name)
        if values["size"] < 0 or shape is None:
            return None
        if any(d < 0 for d in shape[1:]):  # the size written is the number of rows
            rows = int(values["size"])
        else:
            row_size = math.prod(shape[1:])
            rows = int(values["size"]) // row_size if row_size else 0
        low, high = values["min"], -values["neg_max"]
        if math.isinf(low):  # no finite value at all
            low = high = 0.0
        finite = values["finite"] > 0
        return ArraySummary(shape=(rows, *shape[1:]), min=low, max=high,
                            integer_valued=values["integer"] > 0, binary_valued=values["binary"] > 0,
                            row_sum_deviation=values["row_sum_deviation"] if finite else math.inf,
                            dtype=self.dtypes.get(name, ""))
