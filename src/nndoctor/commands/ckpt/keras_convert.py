"""Keras layer weights -> PyTorch parameters, layer type by layer type.

Layout differences (TensorFlow kernels are [h, w, in, out], PyTorch's [out, in, h, w]):

| Keras layer | Keras variables | PyTorch parameters |
|---|---|---|
| Dense | kernel [in, out] | Linear.weight = kernel.T |
| Conv1D/2D/3D | kernel [*k, in, out] | weight = kernel moved to [out, in, *k] |
| DepthwiseConv2D | kernel [h, w, in, m] | Conv2d(groups=in).weight [in*m, 1, h, w]; channel c*m+j = kernel[..., c, j] |
| SeparableConv2D | depthwise [h, w, in, m], pointwise [1, 1, in*m, out] | two Conv2d: depthwise (groups=in, no bias) then 1x1 |
| BatchNormalization | gamma, beta, moving_mean, moving_variance | weight, bias, running_mean, running_var (epsilon compared: Keras 1e-3, PyTorch 1e-5) |
| LayerNormalization | gamma, beta | weight, bias (epsilon compared) |
| Embedding | embeddings [n, d] | weight [n, d] |
| LSTM | kernel [in, 4u], recurrent_kernel [u, 4u], bias [4u] | weight_ih = kernel.T, weight_hh = recurrent.T, bias_ih = bias, bias_hh = 0; gate order i, f, c, o is the same |
| GRU (reset_after=True, the Keras default) | kernel [in, 3u], recurrent [u, 3u], bias [2, 3u] | gates z, r, h reordered to r, z, n; bias[0] -> bias_ih, bias[1] -> bias_hh |

Keras's GRU with ``reset_after=True`` applies the reset gate after the recurrent matrix
product, exactly PyTorch's formulation (which is why it has two biases); ``reset_after=False``
(the old Keras 2 default) has no PyTorch equivalent and is refused.

A Dense layer fed by Flatten of a channels-last feature map sees features ordered H, W, C;
PyTorch flattens C, H, W. When the Keras architecture is known the kernel's rows are
reordered accordingly.

Layers are paired by order within each type: the i-th Keras Conv2D gives the i-th plain
PyTorch Conv2d, and so on (Keras 3 weight files keep only that order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nndoctor.commands.ckpt.keras_weights import KerasLayerWeights

SUPPORTED_KINDS = (
    "dense", "conv1d", "conv2d", "conv3d", "depthwise_conv2d", "separable_conv2d",
    "batch_normalization", "layer_normalization", "embedding", "lstm", "gru",
)


class ConversionError(ValueError):
    """One layer could not be converted (shape or configuration disagreement)."""


@dataclass
class ConversionPlan:
    """Converted tensors by PyTorch key, plus what could not be paired."""

    tensors: dict[str, Any] = field(default_factory=dict)
    pairs: list[tuple[str, str, str]] = field(default_factory=list)  # keras name, kind, torch module
    unused_keras: list[str] = field(default_factory=list)
    unfilled_torch: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    epsilon_mismatches: list[tuple[str, str, float, float]] = field(default_factory=list)
    # Normalization layers whose Keras epsilon the file does not record (weights-only files)
    # while the PyTorch module's eps differs from Keras' default.
    epsilon_unknown: list[UnknownEpsilon] = field(default_factory=list)


# Keras' defaults (keras.io: BatchNormalization and LayerNormalization, "epsilon ... Defaults
# to 1e-3"); PyTorch's BatchNorm*/LayerNorm default to eps=1e-5.
KERAS_DEFAULT_EPSILON = {"batch_normalization": 1e-3, "layer_normalization": 1e-3}


@dataclass(frozen=True)
class UnknownEpsilon:
    """A normalization layer converted without knowing the epsilon Keras used."""

    keras_name: str
    kind: str
    torch_name: str
    torch_eps: float
    keras_default: float
    # Largest relative change of the normalized output if Keras kept its default, from the
    # stored moving variance (BatchNorm only; LayerNorm's variance depends on the input).
    relative_effect: float | None = None


def epsilon_effect(moving_variance: np.ndarray, eps_used: float, eps_meant: float) -> float:
    """max over channels of |sqrt((v + meant) / (v + used)) - 1|: how much larger (or smaller)
    BatchNorm's output (x - mean) / sqrt(v + eps) is with ``eps_used`` instead of ``eps_meant``."""
    v = np.asarray(moving_variance, dtype=np.float64)
    return float(np.max(np.abs(np.sqrt((v + eps_meant) / (v + eps_used)) - 1.0))) if v.size else 0.0


def _t(array: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def _check(name: str, module: Any, converted: dict[str, Any]) -> dict[str, Any]:
    params = dict(module.named_parameters(recurse=False)) | dict(module.named_buffers(recurse=False))
    for key, value in converted.items():
        if key not in params or params[key] is None:
            raise ConversionError(f"{name}: PyTorch module has no '{key}' (bias=False?)")
        if tuple(params[key].shape) != tuple(value.shape):
            raise ConversionError(f"{name}.{key}: Keras gives {list(value.shape)}, PyTorch expects "
                                  f"{list(params[key].shape)}")
    for key, value in params.items():
        if key not in converted and key != "num_batches_tracked" and value is not None:
            raise ConversionError(f"{name}: PyTorch '{key}' has no Keras counterpart (use_bias/center/scale differ?)")
    return converted


def conv_kernel(kernel: np.ndarray) -> np.ndarray:
    """[*k, in, out] -> [out, in, *k]."""
    rank = kernel.ndim
    return np.transpose(kernel, (rank - 1, rank - 2, *range(rank - 2)))


def depthwise_kernel(kernel: np.ndarray) -> np.ndarray:
    """[*k, in, m] -> [in*m, 1, *k], output channel c*m + j."""
    spatial = kernel.shape[:-2]
    channels, multiplier = kernel.shape[-2:]
    moved = np.transpose(kernel, (kernel.ndim - 2, kernel.ndim - 1, *range(kernel.ndim - 2)))
    return moved.reshape(channels * multiplier, 1, *spatial)


def dense_kernel(kernel: np.ndarray, flatten_from: tuple[int, ...] | None) -> np.ndarray:
    if flatten_from:
        # rows in H, W, C order -> C, H, W order to match PyTorch's flatten of NCHW
        *spatial, channels = flatten_from
        out = kernel.shape[1]
        kernel = kernel.reshape(*spatial, channels, out)
        kernel = np.moveaxis(kernel, len(spatial), 0).reshape(-1, out)
    return kernel.T


def _gru_reorder(matrix: np.ndarray, units: int) -> np.ndarray:
    """Keras gate blocks z, r, h (last axis) -> PyTorch r, z, n."""
    z, r, h = (matrix[..., i * units:(i + 1) * units] for i in range(3))
    return np.concatenate([r, z, h], axis=-1)


def convert_layer(layer: KerasLayerWeights, module: Any) -> dict[str, Any]:
    """Tensors for one PyTorch module from one Keras layer (SeparableConv2D excluded)."""
    w = layer.weights
    kind = layer.kind
    name = layer.name
    if kind == "dense":
        out = {"weight": _t(dense_kernel(w["kernel"], layer.config.get("_flatten_from")))}
    elif kind in ("conv1d", "conv2d", "conv3d"):
        out = {"weight": _t(conv_kernel(w["kernel"]))}
    elif kind == "depthwise_conv2d":
        out = {"weight": _t(depthwise_kernel(w["kernel"]))}
    elif kind == "batch_normalization":
        n = w["moving_mean"].shape[0]
        out = {"weight": _t(w.get("gamma", np.ones(n))), "bias": _t(w.get("beta", np.zeros(n))),
               "running_mean": _t(w["moving_mean"]), "running_var": _t(w["moving_variance"])}
        if getattr(module, "weight", None) is None:
            out.pop("weight"), out.pop("bias")
        return _check(name, module, out)
    elif kind == "layer_normalization":
        out = {}
        if "gamma" in w:
            out["weight"] = _t(w["gamma"])
        if "beta" in w:
            out["bias"] = _t(w["beta"])
        return _check(name, module, out)
    elif kind == "embedding":
        return _check(name, module, {"weight": _t(w["embeddings"])})
    elif kind == "lstm":
        out = {"weight_ih_l0": _t(w["kernel"].T), "weight_hh_l0": _t(w["recurrent_kernel"].T)}
        if "bias" in w:
            out["bias_ih_l0"] = _t(w["bias"])
            out["bias_hh_l0"] = _t(np.zeros_like(w["bias"]))
        return _check(name, module, out)
    elif kind == "gru":
        units = w["recurrent_kernel"].shape[0]
        if layer.config.get("reset_after", True) is False or ("bias" in w and w["bias"].ndim == 1):
            raise ConversionError(f"{name}: GRU with reset_after=False has no PyTorch equivalent "
                                  f"(PyTorch applies the reset gate after the recurrent product)")
        out = {"weight_ih_l0": _t(_gru_reorder(w["kernel"], units).T),
               "weight_hh_l0": _t(_gru_reorder(w["recurrent_kernel"], units).T)}
        if "bias" in w:
            out["bias_ih_l0"] = _t(_gru_reorder(w["bias"][0], units))
            out["bias_hh_l0"] = _t(_gru_reorder(w["bias"][1], units))
        return _check(name, module, out)
    else:
        raise ConversionError(f"{name}: Keras layer type '{kind}' is not supported")
    if "bias" in w:
        out["bias"] = _t(w["bias"])
    return _check(name, module, out)


def torch_kind(module: Any, next_module: Any = None) -> list[str]:
    """Keras kinds that can fill this PyTorch module, most specific first."""
    from torch import nn

    if isinstance(module, nn.Linear):
        return ["dense"]
    if isinstance(module, nn.Conv2d) and module.groups > 1 and module.groups == module.in_channels:
        return ["separable_conv2d", "depthwise_conv2d"] if isinstance(next_module, nn.Conv2d) else ["depthwise_conv2d"]
    for cls, kind in ((nn.Conv1d, "conv1d"), (nn.Conv2d, "conv2d"), (nn.Conv3d, "conv3d"),
                      (nn.LayerNorm, "layer_normalization"), (nn.Embedding, "embedding"),
                      (nn.LSTM, "lstm"), (nn.GRU, "gru")):
        if isinstance(module, cls):
            return [kind]
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return ["batch_normalization"]
    return []


def torch_slots(model: Any) -> list[tuple[str, Any]]:
    """Modules that own parameters directly, in registration order."""
    slots = []
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)) or any(
            True for _ in module.named_buffers(recurse=False)
        ):
            slots.append((name, module))
    return slots


def _prefixed(prefix: str, tensors: dict[str, Any]) -> dict[str, Any]:
    return {(f"{prefix}.{k}" if prefix else k): v for k, v in tensors.items()}


def plan_conversion(layers: list[KerasLayerWeights], model: Any) -> ConversionPlan:
    plan = ConversionPlan()
    queues: dict[str, list[KerasLayerWeights]] = {}
    for entry in layers:
        queues.setdefault(entry.kind, []).append(entry)
    slots = torch_slots(model)
    consumed: set[str] = set()
    for index, (name, module) in enumerate(slots):
        if name in consumed:
            continue
        next_module = slots[index + 1][1] if index + 1 < len(slots) else None
        kinds = torch_kind(module, next_module)
        if not kinds:
            plan.unfilled_torch.append(f"{name} ({type(module).__name__}: no Keras counterpart supported)")
            continue
        layer = None
        for kind in kinds:
            candidates = queues.get(kind) or []
            if kind == "separable_conv2d" and candidates:
                depth = depthwise_kernel(candidates[0].weights["depthwise_kernel"])
                if tuple(depth.shape) != tuple(module.weight.shape):
                    continue
            if candidates:
                layer = candidates.pop(0)
                break
        if layer is None:
            plan.unfilled_torch.append(f"{name} ({type(module).__name__})")
            continue
        try:
            if layer.kind == "separable_conv2d":
                next_name = slots[index + 1][0]
                w = layer.weights
                plan.tensors.update(_prefixed(name, _check(layer.name, module, {
                    "weight": _t(depthwise_kernel(w["depthwise_kernel"]))})))
                point = {"weight": _t(conv_kernel(w["pointwise_kernel"]))}
                if "bias" in w:
                    point["bias"] = _t(w["bias"])
                plan.tensors.update(_prefixed(next_name, _check(layer.name, next_module, point)))
                consumed.add(next_name)
                plan.pairs.append((layer.name, layer.kind, f"{name} + {next_name}"))
            else:
                plan.tensors.update(_prefixed(name, convert_layer(layer, module)))
                plan.pairs.append((layer.name, layer.kind, name))
        except ConversionError as error:
            plan.errors.append(str(error))
            continue
        eps = layer.config.get("epsilon")
        if layer.kind in KERAS_DEFAULT_EPSILON and eps is not None:
            if abs(float(eps) - float(module.eps)) > 1e-12:
                plan.epsilon_mismatches.append((layer.name, name, float(eps), float(module.eps)))
        elif layer.kind in KERAS_DEFAULT_EPSILON:
            default = KERAS_DEFAULT_EPSILON[layer.kind]
            if abs(default - float(module.eps)) > 1e-12:
                variance = layer.weights.get("moving_variance")
                effect = epsilon_effect(variance, float(module.eps), default) if variance is not None else None
                plan.epsilon_unknown.append(UnknownEpsilon(layer.name, layer.kind, name, float(module.eps),
                                                           default, effect))
    for kind, remaining in queues.items():
        plan.unused_keras += [f"{layer.name} ({kind})" for layer in remaining]
    return plan
