"""Batch statistics out of a TensorFlow graph without changing it.

On the TensorFlow backend ``fit``/``evaluate`` trace the train/test step into a graph once;
Python sees only symbolic tensors there. The probe copies the first rows of y and the
predictions (and of image inputs) into nndoctor's own variable, which is read after the call
and summarised in NumPy (``facts.summarize``, as for eager values); a tensor too wide to copy
gets a few read-only reductions (min, max, integrality, row sums over at most ``MAX_ROWS``
rows) written instead. Nothing the model computes reads them back, so the user's numbers are
unchanged; variable writes are XLA-compatible, unlike ``tf.py_function``.
"""

from __future__ import annotations

import math
from typing import Any

from nndoctor.keras.facts import MAX_ROWS, ArraySummary, summarize

# What the traced step writes, in this order: the minima over the rows of five per-value
# quantities (so one reduction computes them all), then the row-sum deviation and the size.
# Before the first write every field is -1 (a size is never negative).
_FIELDS = ("min", "neg_max", "integer", "binary", "finite", "row_sum_deviation", "size")
TENSORS = ("x", "y", "y_pred")
# A tensor is copied (rather than reduced in the graph) when this many of its first rows
# hold at most COPY_ELEMENTS values: a copy is one fused write for XLA to compile, where the
# ~30 reductions of ``_statistics`` cost ~35 ms to trace and ~50 ms to compile per tensor at
# every ``fit`` (measured on a 2-core CPU), for the same summary.
COPY_ELEMENTS = 16384
MIN_COPY_ROWS = 32


def is_symbolic(value: Any) -> bool:
    """A tensor of a graph being traced (its shape may be known, its values are not)."""
    return type(value).__name__ in ("SymbolicTensor", "KerasTensor")


def static_shape(value: Any) -> tuple[int, ...]:
    """The traced shape, -1 for the dimensions only known at run time (the batch)."""
    return tuple(-1 if d is None else int(d) for d in value.shape)


class GraphProbe:
    """nndoctor's variable for one model and phase, written by the traced step."""

    def __init__(self) -> None:
        self.variable: Any = None  # created by ``prepare``, once the traced shapes are known
        self.layout: dict[str, tuple[str, int, int, int]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}
        self.shape_only: dict[str, tuple[tuple[int, ...], str]] = {}  # traced, values not read

    def prepare(self, tensors: dict[str, Any]) -> None:
        """In the step's first trace (a ``tf.function`` creates variables in its first trace only):
        lay out what each of ``TENSORS`` writes and create nndoctor's variable for it, outside the
        user's graph. One variable for all the tensors: each variable an XLA-compiled step
        updates costs compile time of its own (measured: ~35 ms each). A new layout (the same
        model fit again on other data, after ``compile`` made a new train function) gets a new
        variable; in a retrace of the same function none can be created: the earlier layout and
        its values (an earlier batch of the same call) are kept.

        The inputs' values are read only when they are image-shaped (rank ≥ 4): no check reads
        the values of other inputs (D101 reads image ranges, K108 only shapes). Other inputs
        keep their traced shape and dtype."""
        import tensorflow as tf

        shape_only = {}
        x = tensors.get("x")
        rank = getattr(getattr(x, "shape", None), "rank", None)
        if isinstance(x, tf.Tensor) and rank is not None and rank < 4:
            shape_only["x"] = (static_shape(x), x.dtype.name)
        layout = self._layout(tensors, shape_only)
        if self.variable is not None and (layout, shape_only) == (self.layout, self.shape_only):
            return
        if not layout:
            self.shape_only = shape_only  # nothing to write, the shapes still known
            return
        size = max(offset + written for _, offset, _, written in layout.values())
        try:
            with tf.init_scope():
                variable = tf.Variable(tf.fill([size], tf.constant(-1.0, tf.float64)), trainable=False,
                                       name="nndoctor_batch_statistics")
        except ValueError:  # a retrace: no variable can be created in it
            return
        self.variable, self.layout, self.shape_only = variable, layout, shape_only
        self.shapes = {name: static_shape(tensors[name]) for name in layout}
        self.dtypes = {name: tensors[name].dtype.name for name in layout}

    def record(self, tensors: dict[str, Any]) -> None:
        """Inside the trace: the first rows (or the reductions) of each of ``TENSORS``, one write of
        them all to our variable. A retrace whose tensors lay out differently (another row shape)
        writes nothing: the first layout's values are kept."""
        import tensorflow as tf

        self.prepare(tensors)
        if self.variable is None or self._layout(tensors, self.shape_only) != self.layout:
            return
        counts, parts = [], []
        for name, (kind, _, rows, _) in self.layout.items():
            if kind == "copy":
                count, padded = self._copy(tensors[name], rows)
                counts.append(count)
                parts.append(padded)
            else:
                parts.append(self._statistics(name, tensors[name]))
        # How many values each copied tensor wrote (rows × row size) go first.
        self.variable.assign(tf.concat([*([tf.stack(counts)] if counts else []), *parts], axis=0))

    def _layout(self, tensors: dict[str, Any], shape_only: dict) -> dict[str, tuple[str, int, int, int]]:
        """name -> (how, offset, rows copied, values written), from the traced shapes only. The
        copied tensors' value counts come first, in ``TENSORS`` order (see ``record``)."""
        planned = {name: self._plan(tensors.get(name)) for name in TENSORS if name not in shape_only}
        layout, offset = {}, sum(1 for p in planned.values() if p is not None and p[0] == "copy")
        for name, plan in planned.items():
            if plan is not None:
                kind, rows, written = plan
                layout[name] = (kind, offset, rows, written)
                offset += written
        return layout

    @staticmethod
    def _plan(tensor: Any) -> tuple[str, int, int] | None:
        """("copy", rows, values written) for a tensor whose first rows are copied, ("stats", 0,
        len(_FIELDS)) for one reduced in the graph; None for a tensor with no numbers."""
        import tensorflow as tf

        if not isinstance(tensor, tf.Tensor) or tensor.shape.rank is None or tensor.shape.rank == 0:
            return None
        if not (tensor.dtype.is_floating or tensor.dtype.is_integer or tensor.dtype.is_bool):
            return None
        shape = static_shape(tensor)
        row_size = math.prod(shape[1:])
        rows = min(MAX_ROWS, COPY_ELEMENTS // row_size) if all(d >= 0 for d in shape[1:]) and row_size else 0
        if rows < MIN_COPY_ROWS:
            return "stats", 0, len(_FIELDS)
        return "copy", rows, rows * row_size

    @staticmethod
    def _copy(tensor: Any, rows: int) -> tuple[Any, Any]:
        """(how many values, the first ``rows`` rows flattened and zero-padded): a few ops (each
        one is traced, and compiled by XLA, at every ``fit``)."""
        import tensorflow as tf

        size = rows * math.prod(tensor.shape[1:])
        flat = tf.reshape(tf.cast(tensor[:rows], tf.float64), [-1])
        padded = tf.slice(tf.concat([flat, tf.zeros([size], tf.float64)], axis=0), [0], [size])
        padded.set_shape([size])  # never fewer: the zeros alone are that long
        return tf.cast(tf.size(flat, out_type=tf.int64), tf.float64), padded

    def _statistics(self, name: str, tensor: Any) -> Any:
        """The reductions of one tensor, in ``_FIELDS`` order.

        Few ops on purpose (about 30): each one is traced, and compiled by XLA with the step
        (``jit_compile``), at every ``fit``. Integrality and 0/1 values are judged on the finite
        values only, as ``facts.summarize`` does on arrays."""
        import tensorflow as tf

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
        """The summary of what the last executed step wrote (None before any step ran)."""
        if name in self.shape_only:
            traced, dtype = self.shape_only[name]
            nan = math.nan
            return ArraySummary(traced, nan, nan, False, False, nan, dtype=dtype, has_values=False)
        if self.variable is None or name not in self.layout:
            return None
        kind, offset, rows, _ = self.layout[name]
        shape = self.shapes[name]
        if kind == "copy":
            return self._read_copy(name, offset, rows, shape)
        written = self.variable.numpy()[offset:offset + len(_FIELDS)]
        return self._read_statistics(name, written, shape)

    def _read_copy(self, name: str, offset: int, rows: int, shape: tuple[int, ...]) -> ArraySummary | None:
        import numpy as np
        import tensorflow as tf

        written = self.variable.numpy()
        copied = [n for n, (kind, *_) in self.layout.items() if kind == "copy"]
        count = round(written[copied.index(name)])  # values the step copied (-1: no step wrote)
        if count <= 0:
            return None
        row_size = math.prod(shape[1:])
        values = written[offset:offset + count].reshape((count // row_size, *shape[1:]))
        # Back to the traced dtype (exact: every value came from it), so the summary is the eager one.
        numpy_dtype = tf.as_dtype(self.dtypes[name]).as_numpy_dtype
        return summarize(np.asarray(values).astype(numpy_dtype))

    def _read_statistics(self, name: str, written: Any, shape: tuple[int, ...]) -> ArraySummary | None:
        values = dict(zip(_FIELDS, (float(v) for v in written), strict=True))
        if values["size"] < 0:
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
