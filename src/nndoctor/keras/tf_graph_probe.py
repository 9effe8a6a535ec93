"""Batch statistics out of a TensorFlow graph without changing it.

On the TensorFlow backend ``fit``/``evaluate`` trace the train/test step into a graph once;
Python sees only symbolic tensors there. The probe adds a few read-only reductions (min,
max, integrality, row sums over at most ``MAX_ROWS`` rows) of x, y and the predictions and
writes them into nndoctor's own variables, which are read after the call. Nothing the
model computes reads them back, so the user's numbers are unchanged; variable writes are
XLA-compatible, unlike ``tf.py_function``.
"""

from __future__ import annotations

import math
from typing import Any

from nndoctor.keras.facts import MAX_ROWS, ArraySummary

_FIELDS = ("written", "min", "max", "integer", "binary", "row_sum_deviation", "rows")
TENSORS = ("x", "y", "y_pred")


def is_symbolic(value: Any) -> bool:
    """A tensor of a graph being traced (its shape may be known, its values are not)."""
    return type(value).__name__ in ("SymbolicTensor", "KerasTensor")


def static_shape(value: Any) -> tuple[int, ...]:
    """The traced shape, -1 for the dimensions only known at run time (the batch)."""
    return tuple(-1 if d is None else int(d) for d in value.shape)


class GraphProbe:
    """nndoctor's variables for one model and phase, written by the traced step."""

    def __init__(self) -> None:
        import tensorflow as tf

        self.variables = {name: tf.Variable(tf.zeros(len(_FIELDS), tf.float64), trainable=False,
                                            name=f"nndoctor_{name}")
                          for name in TENSORS}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}

    def record(self, name: str, tensor: Any) -> None:
        """Inside the trace: add the reductions of ``tensor`` and the write to our variable."""
        import tensorflow as tf

        if not isinstance(tensor, tf.Tensor) or tensor.shape.rank is None or tensor.shape.rank == 0:
            return
        if not (tensor.dtype.is_floating or tensor.dtype.is_integer or tensor.dtype.is_bool):
            return
        self.shapes[name] = static_shape(tensor)
        self.dtypes[name] = tensor.dtype.name
        rows = tf.cast(tensor[:MAX_ROWS], tf.float64)
        finite = tf.math.is_finite(rows)
        inf = tf.constant(math.inf, tf.float64)
        row_sums = tf.reduce_sum(rows, axis=-1)
        deviation = tf.where(tf.reduce_all(finite), tf.reduce_max(tf.abs(row_sums - 1)), inf)
        stats = tf.stack([
            tf.constant(1.0, tf.float64),
            tf.reduce_min(tf.where(finite, rows, inf)),
            tf.reduce_max(tf.where(finite, rows, -inf)),
            tf.cast(tf.reduce_all(tf.equal(rows, tf.round(rows))), tf.float64),
            tf.cast(tf.reduce_all(tf.logical_or(tf.equal(rows, 0), tf.equal(rows, 1))), tf.float64),
            deviation,
            tf.cast(tf.shape(rows)[0], tf.float64),
        ])
        self.variables[name].assign(stats)

    def read(self, name: str) -> ArraySummary | None:
        """The statistics the last executed step wrote (None before any step ran)."""
        values = dict(zip(_FIELDS, (float(v) for v in self.variables[name].numpy()), strict=True))
        shape = self.shapes.get(name)
        if not values["written"] or shape is None:
            return None
        shape = (int(values["rows"]), *shape[1:])
        if math.isinf(values["min"]):  # no finite value at all
            values["min"] = values["max"] = 0.0
        return ArraySummary(shape=shape, min=values["min"], max=values["max"],
                            integer_valued=bool(values["integer"]), binary_valued=bool(values["binary"]),
                            row_sum_deviation=values["row_sum_deviation"], dtype=self.dtypes.get(name, ""))
