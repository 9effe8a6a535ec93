"""What one observed Keras batch tells the K checks, as plain numbers and names.

Built from the model, the batch (x, y) and the predictions inside ``compute_loss``; it
holds no tensor and no layer (locations and small summaries only), so the checks can keep
it without keeping the user's objects alive.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nndoctor.core.findings import Location

if TYPE_CHECKING:  # NumPy is imported when a batch is read: the catalog must load without it
    import numpy as np

# Bounded work: at most this many samples of a batch are read.
MAX_ROWS = 256
PROBABILITY_TOLERANCE = 1e-3
_LOSS_KINDS = (("sparsecategorical", "sparse"), ("categorical", "categorical"), ("binary", "binary"))


@dataclass(frozen=True)
class LossConfig:
    """The compiled loss of a single-output model: its name, family and ``from_logits``."""

    name: str
    kind: str | None  # "sparse", "categorical", "binary" or None (not a cross-entropy)
    from_logits: bool


@dataclass(frozen=True)
class ArraySummary:
    shape: tuple[int, ...]
    min: float
    max: float
    integer_valued: bool
    binary_valued: bool  # every value is 0 or 1
    row_sum_deviation: float  # max |sum over the last axis - 1|
    dtype: str = ""
    # False for Keras's symbolic passes (torch "meta" tensors): the shape is real, the numbers are not.
    has_values: bool = True


@dataclass(frozen=True)
class ConvFacts:
    layer_name: str
    data_format: str
    in_channels: int
    location: Location | None


@dataclass(frozen=True)
class BatchNormFacts:
    layer_name: str
    momentum: float
    location: Location | None


@dataclass
class BatchFacts:
    """One observed batch of ``fit`` (phase "fit") or ``evaluate`` (phase "evaluate")."""

    phase: str
    call_location: Location | None
    compile_location: Location | None
    loss: LossConfig | None
    output_layer: str | None
    output_activation: str | None
    output_location: Location | None
    x: ArraySummary | None
    y: ArraySummary | None
    y_pred: ArraySummary | None
    first_conv: ConvFacts | None
    # Class names of the layers up to the first learned one (Conv/Dense), InputLayer left out.
    leading_layers: tuple[str, ...] = ()
    batch_norms: list[BatchNormFacts] = field(default_factory=list)
    backend: str = ""
    # TensorFlow backend: the predictions carry the logits of the Keras softmax/sigmoid that made
    # them (see ``loss_reads_logits``), so a cross-entropy computes on those logits.
    logits_kept: bool = False


# -- custom training loops (TensorFlow): K105, K109 --------------------------------------
@dataclass(frozen=True)
class ModelCall:
    """One call of a model (or layer) from the user's code."""

    model_name: str
    training: bool | None  # as passed; None when the call does not pass training=
    under_tape: bool  # made while a tf.GradientTape records
    location: Location | None
    mode_layers: tuple[str, ...]  # "Dropout 'dropout'", "BatchNormalization 'bn'"…


@dataclass
class TraceHistory:
    """The calls and traces of one ``tf.function``."""

    name: str
    definition: Location | None
    calls: int = 0
    consecutive_traces: int = 0  # calls in a row, the latest included, that traced a new graph
    # One entry per trace: argument name -> description ("float 0.1", "tensor (17, 8) float32").
    traces: list[dict[str, str]] = field(default_factory=list)


# -- pure helpers ------------------------------------------------------------------------

def loss_kind(name: str) -> str | None:
    """"sparse_categorical_crossentropy" -> "sparse"; only cross-entropies have a kind."""
    key = name.lower().replace("_", "")
    if "crossentropy" not in key:
        return None
    for marker, kind in _LOSS_KINDS:
        if marker in key:
            return kind
    return None


def loss_config(loss: Any) -> LossConfig | None:
    """The compiled loss as Keras stores it (a string, a Loss object or a function)."""
    if loss is None or isinstance(loss, (list, tuple, dict)):
        return None  # several outputs: not covered yet
    if isinstance(loss, str):
        # String losses are the functions with their defaults: from_logits=False.
        return LossConfig(loss, loss_kind(loss), False)
    keywords: dict[str, Any] = {}
    if isinstance(loss, functools.partial):
        keywords, loss = dict(loss.keywords or {}), loss.func
    if inspect.isfunction(loss) or inspect.isbuiltin(loss):
        name = loss.__name__
        from_logits = keywords.get("from_logits", False)
    else:  # a keras.losses.Loss object (LossFunctionWrapper keeps the keywords in _fn_kwargs)
        name = type(loss).__name__
        from_logits = getattr(loss, "from_logits", None)
        if from_logits is None:
            from_logits = (getattr(loss, "_fn_kwargs", None) or {}).get("from_logits", False)
    return LossConfig(name, loss_kind(name), bool(from_logits))


def to_numpy(value: Any) -> np.ndarray | None:
    """A bounded NumPy copy of a batch tensor (read only; no grad, no device sync beyond the copy)."""
    import numpy as np

    if value is None or isinstance(value, (list, tuple, dict)):
        return None
    if not hasattr(value, "shape") or not hasattr(value, "__getitem__"):
        return None  # a dataset, generator or PyDataset: read per batch instead
    if hasattr(value, "detach"):  # torch backend
        value = value[:MAX_ROWS].detach().cpu().numpy()
    elif hasattr(value, "numpy") and hasattr(value, "dtype") and not isinstance(value, np.ndarray):
        value = value[:MAX_ROWS].numpy()  # an eager TensorFlow tensor (or a variable)
    else:
        value = np.asarray(value)[:MAX_ROWS]
    if value.dtype == object or value.size == 0:
        return None
    return value


def summarize(value: Any) -> ArraySummary | None:
    # Torch "meta" tensors (Keras's symbolic pass) and tensors of a TensorFlow graph being traced.
    if getattr(value, "is_meta", False) or type(value).__name__ == "SymbolicTensor":
        nan = float("nan")
        shape = tuple(-1 if s is None else int(s) for s in value.shape)
        return ArraySummary(shape, nan, nan, False, False, nan, has_values=False)
    array = to_numpy(value)
    if array is None:
        return None
    import numpy as np

    data = array.astype(np.float64, copy=False)
    if not np.isfinite(data).all():
        data = data[np.isfinite(data)] if np.isfinite(data).any() else np.zeros(1)
        rows = None
    else:
        rows = data
    deviation = float(np.abs(rows.sum(axis=-1) - 1).max()) if rows is not None and rows.ndim >= 1 else float("inf")
    return ArraySummary(
        shape=tuple(int(s) for s in array.shape),
        min=float(data.min()),
        max=float(data.max()),
        integer_valued=bool(np.all(data == np.round(data))),
        binary_valued=bool(np.all((data == 0) | (data == 1))),
        row_sum_deviation=deviation,
        dtype=str(array.dtype),
    )


def is_symbolic_value(value: Any) -> bool:
    """A torch "meta" tensor or a tensor of a TensorFlow graph being traced: no values to read."""
    return getattr(value, "is_meta", False) or type(value).__name__ in ("SymbolicTensor", "KerasTensor")


def scalar_finite_on_cpu(value: Any) -> bool | None:
    """Whether a loss tensor is finite, read only where that costs no device sync (CPU); else None."""
    import math

    device = getattr(value, "device", None)
    device_type = getattr(device, "type", None) if device is not None and not isinstance(device, str) else device
    if device_type is not None and "cpu" not in str(device_type).lower():
        return None
    if hasattr(value, "detach"):
        value = value.detach()
    try:
        return all(math.isfinite(float(v)) for v in (value.reshape(-1) if hasattr(value, "reshape") else [value]))
    except (TypeError, ValueError):
        return None


def looks_like_probabilities(summary: ArraySummary) -> bool:
    """Every value in [0, 1] and rows summing to 1 over ≥ 2 classes (a softmax output)."""
    return (
        summary.has_values and len(summary.shape) >= 2 and summary.shape[-1] >= 2
        and summary.min >= -PROBABILITY_TOLERANCE and summary.max <= 1 + PROBABILITY_TOLERANCE
        and summary.row_sum_deviation <= PROBABILITY_TOLERANCE
    )


def loss_reads_logits(value: Any, backend: str) -> bool:
    """Whether a Keras cross-entropy given ``value`` computes on the logits before its softmax or
    sigmoid rather than on ``value``: on the TensorFlow backend, Keras's softmax/sigmoid (the
    activation, ``keras.ops``) keep their input on the output tensor (``_keras_logits``), and in a
    traced function an output made by a ``Softmax``/``Sigmoid`` op is traced back to that op's
    input; the loss then uses those logits whatever ``from_logits`` says. The torch backend has no
    such substitution."""
    if backend != "tensorflow" or value is None:
        return False
    if getattr(value, "_keras_logits", None) is not None:
        return True
    if type(value).__name__ != "SymbolicTensor":
        return False  # an eager tensor has no op to trace back
    op = getattr(value, "op", None)
    return getattr(op, "type", None) in ("Softmax", "Sigmoid")


def activation_name(layer: Any) -> str | None:
    """"softmax", "sigmoid", "linear"… of a layer (Dense(activation=…), Activation, Softmax)."""
    if layer is None:
        return None
    if type(layer).__name__ == "Softmax":
        return "softmax"
    activation = getattr(layer, "activation", None)
    if activation is None:
        return None
    if isinstance(activation, str):
        return activation
    return getattr(activation, "__name__", None)
