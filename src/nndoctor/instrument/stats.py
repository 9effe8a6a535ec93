"""Tensor statistics computed once per sampled event and shared by every check.

One fused reduction per tensor, copied to the host with a single synchronisation. Checks
are pure functions of these numbers, so they can be unit-tested without a training loop.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TensorStats:
    shape: tuple[int, ...]
    dtype: str
    device: str
    is_floating: bool
    numel: int
    min: float
    max: float
    mean: float
    std: float
    nonfinite: int  # NaN or Inf elements
    zero_fraction: float
    # For 4-D image-like batches: per-channel means/stds over (N, H, W) along dim 1,
    # and along the last dim (to recognise N,H,W,C layouts).
    channel_mean_dim1: tuple[float, ...] | None = None
    channel_std_dim1: tuple[float, ...] | None = None
    channel_mean_last: tuple[float, ...] | None = None
    channel_std_last: tuple[float, ...] | None = None

    @property
    def finite(self) -> bool:
        return self.nonfinite == 0

    @property
    def is_integer(self) -> bool:
        return not self.is_floating and self.dtype != "torch.bool"

    def describe(self) -> str:
        shape = "×".join(str(s) for s in self.shape) or "scalar"
        return f"{self.dtype.replace('torch.', '')}[{shape}] range [{self.min:.4g}, {self.max:.4g}] mean {self.mean:.4g} std {self.std:.4g}"


def _finite_only_stats(flat: torch.Tensor) -> torch.Tensor:
    """min, max, mean, std, non-finite count, zero count over the finite entries only.

    The slow path, for tensors that hold NaN/Inf (rare): masks and a float64 pass.
    """
    finite_mask = torch.isfinite(flat)
    nonfinite = (~finite_mask).sum().to(torch.float64)
    clean = torch.where(finite_mask, flat, torch.zeros((), dtype=flat.dtype, device=flat.device))
    count = finite_mask.sum().clamp(min=1).to(torch.float64)
    big = torch.finfo(flat.dtype).max
    mn = torch.where(finite_mask, flat, torch.full((), big, dtype=flat.dtype, device=flat.device)).min()
    mx = torch.where(finite_mask, flat, torch.full((), -big, dtype=flat.dtype, device=flat.device)).max()
    mean = clean.to(torch.float64).sum() / count
    var = ((clean.to(torch.float64) - mean) ** 2 * finite_mask).sum() / count
    zeros = (flat == 0).sum().to(torch.float64)
    return torch.stack([mn.to(torch.float64), mx.to(torch.float64), mean, var.sqrt(), nonfinite, zeros])


def _plain_stats(flat: torch.Tensor) -> torch.Tensor:
    """min, max, mean, std, 0, zero count, assuming every entry is finite.

    Four passes over the data and no mask: ``aminmax`` and a Welford ``var_mean``. NaN and
    ±Inf show up in the min or max, so a non-finite min/max tells the caller to redo the
    tensor with ``_finite_only_stats``. (On a 128×3×224×224 batch this is a few passes
    instead of the masked path's dozen, several of them float64.)
    """
    mn, mx = torch.aminmax(flat)
    var, mean = torch.var_mean(flat, correction=0)
    zeros = (flat == 0).sum()
    zero = torch.zeros((), dtype=torch.float64, device=flat.device)
    return torch.stack([mn.double(), mx.double(), mean.double(), var.sqrt().double(), zero, zeros.double()])


# Beyond this magnitude a float32 variance (squares up to 1e38) loses range: redo in float64.
_HUGE = 1e18


def _channel_stats(x: torch.Tensor) -> list[torch.Tensor]:
    """Per-channel means and standard deviations of a 4-D batch along dim 1 and the last dim."""
    parts = []
    for dims, channel in (((0, 2, 3), 1), ((0, 1, 2), 3)):
        if x.numel() // x.shape[channel] > 1:
            std, mean = torch.std_mean(x, dim=dims)
        else:
            mean = x.mean(dim=dims)
            std = torch.zeros_like(mean)
        parts += [mean.double(), std.double()]
    return parts


def has_plain_values(tensor: Any) -> bool:
    """A dense (strided) tensor whose values can be read: not sparse (COO, CSR, ...), nested,
    quantized, meta or fake (FakeTensorMode, torch.compile tracing). Statistics skip the rest."""
    if type(tensor) is torch.Tensor:  # the usual case, asked on every step: no subclass (FakeTensor is one)
        return tensor.layout == torch.strided and not (tensor.is_nested or tensor.is_quantized or tensor.is_meta)
    if not isinstance(tensor, torch.Tensor):
        return False
    try:
        if tensor.layout != torch.strided or tensor.is_nested or tensor.is_quantized or tensor.is_meta:
            return False
    except (RuntimeError, NotImplementedError):  # an exotic subclass that cannot say
        return False
    return not _is_fake(tensor)


def _is_fake(tensor: torch.Tensor) -> bool:
    fake = getattr(getattr(torch, "_subclasses", None), "FakeTensor", None)
    return fake is not None and isinstance(tensor, fake)


def summarize(tensor: torch.Tensor, channels: bool = True) -> TensorStats | None:
    """Statistics of a tensor, or None for empty/complex/unsupported tensors.

    One synchronisation for a finite tensor; a second one, on a masked slow path, only when
    the tensor holds NaN or Inf.
    """
    if not has_plain_values(tensor) or tensor.is_complex() or tensor.numel() == 0:
        return None
    with torch.no_grad(), torch.autocast(tensor.device.type, enabled=False):
        x = tensor.detach()
        floating = x.is_floating_point()
        flat = x.reshape(-1)
        if floating:
            if flat.dtype in (torch.float16, torch.bfloat16):
                flat = flat.float()
            head = _plain_stats(flat)
        else:
            as_float = flat.to(torch.float64)
            head = torch.stack([
                as_float.min(), as_float.max(), as_float.mean(), as_float.std(unbiased=False)
                if as_float.numel() > 1 else torch.zeros((), dtype=torch.float64, device=x.device),
                torch.zeros((), dtype=torch.float64, device=x.device), (flat == 0).sum().to(torch.float64),
            ])
        parts = [head]
        c1 = cl = None
        if channels and x.dim() == 4 and floating:
            xf = x.float()
            c1, cl = xf.shape[1], xf.shape[-1]
            parts += _channel_stats(xf)
        values = torch.cat([p.reshape(-1) for p in parts]).cpu().tolist()  # the one sync
        if floating and not (math.isfinite(values[0]) and math.isfinite(values[1])):
            values[:6] = _finite_only_stats(flat).cpu().tolist()  # NaN/Inf present: mask them
        elif floating and flat.dtype != torch.float64 and max(abs(values[0]), abs(values[1])) > _HUGE:
            values[:6] = _plain_stats(flat.double()).cpu().tolist()  # squares would overflow float32
    mn, mx, mean, std, nonfinite, zeros = values[:6]
    rest = values[6:]
    kw: dict[str, Any] = {}
    if c1 is not None and cl is not None:
        kw["channel_mean_dim1"] = tuple(rest[:c1])
        kw["channel_std_dim1"] = tuple(rest[c1: 2 * c1])
        kw["channel_mean_last"] = tuple(rest[2 * c1: 2 * c1 + cl])
        kw["channel_std_last"] = tuple(rest[2 * c1 + cl: 2 * c1 + 2 * cl])
    numel = tensor.numel()
    return TensorStats(
        shape=tuple(tensor.shape), dtype=str(tensor.dtype), device=str(tensor.device),
        is_floating=floating, numel=numel, min=float(mn), max=float(mx), mean=float(mean),
        std=float(std) if not math.isnan(std) else 0.0, nonfinite=int(nonfinite),
        zero_fraction=float(zeros) / numel, **kw,
    )


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first tensor found in a (nested) batch, output or argument tuple."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def first_plain_tensor(value: Any) -> torch.Tensor | None:
    """``first_tensor`` when its values can be read (``has_plain_values``), else None: checks
    that compute statistics skip sparse, nested, quantized, meta and fake tensors."""
    tensor = first_tensor(value)
    return tensor if tensor is not None and has_plain_values(tensor) else None


# Keyword names under which models take their main input (Hugging Face's conventions first:
# Trainer and accelerate loops call ``model(**batch)``), and keywords that are never it.
_INPUT_KEYWORDS = ("pixel_values", "input_values", "input_features", "inputs_embeds", "images", "image",
                   "inputs", "input", "x")
_NOT_INPUT_KEYWORDS = frozenset({
    "labels", "label", "label_ids", "targets", "target", "y", "attention_mask", "token_type_ids",
    "position_ids", "head_mask", "pixel_mask", "decoder_attention_mask", "return_loss"})


def model_input_tensor(inputs: Any, kwargs: dict[str, Any] | None) -> torch.Tensor | None:
    """The tensor a model call is fed: its first positional tensor, else its main keyword
    input (``pixel_values``, ``input_values``, ``inputs_embeds`` … by name; else the first
    tensor of a keyword that is not a label or a mask: a ``model(**batch)`` batch may put
    ``labels`` first, as ``default_data_collator`` does). Only tensors whose values can be read."""
    tensor = first_plain_tensor(inputs)
    if tensor is not None or not kwargs:
        return tensor
    for name in _INPUT_KEYWORDS:
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor):
            return value if has_plain_values(value) else None
    for name, value in kwargs.items():
        if name not in _NOT_INPUT_KEYWORDS:
            found = first_plain_tensor(value)
            if found is not None:
                return found
    return None


def tensors_in(value: Any, limit: int = 64) -> list[torch.Tensor]:
    """All tensors in a nested structure (bounded, to stay cheap on huge batches)."""
    found: list[torch.Tensor] = []
    stack = [value]
    while stack and len(found) < limit:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
    return found


def describe_structure(value: Any, depth: int = 0) -> Any:
    """Shapes/dtypes/devices of a nested structure, as plain data (for crash evidence)."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}@{value.device}"
    if depth > 3:
        return "…"
    if isinstance(value, dict):
        return {str(k): describe_structure(v, depth + 1) for k, v in list(value.items())[:16]}
    if isinstance(value, (list, tuple)):
        items = [describe_structure(v, depth + 1) for v in list(value)[:16]]
        return items if isinstance(value, list) else tuple(items)
    return type(value).__name__


class _RecentStats:
    """The statistics of the last few tensors summarised, found again by identity.

    A model's input is usually also its first layer's input, and several events (the layer's
    output event, the model's forward event) ask for it: the second asker gets the same
    numbers without another reduction and synchronisation. Entries hold weak references
    only and are reused within one step only, for the same storage and version counter:
    some writes do not move the version counter (through numpy on a ``from_numpy`` buffer,
    through ``.data``), so a buffer refilled every step is summarised every step.
    """

    def __init__(self, size: int = 8) -> None:
        self._entries: deque[tuple[weakref.ref, tuple, TensorStats | None]] = deque(maxlen=size)

    @staticmethod
    def _key(tensor: torch.Tensor, step: Any) -> tuple:
        return (step, tensor_version(tensor), tensor.data_ptr() if tensor.layout == torch.strided else -1)

    def get(self, tensor: torch.Tensor, step: Any) -> tuple[bool, TensorStats | None]:
        key = self._key(tensor, step)
        if key[1] < 0:
            return False, None
        for ref, seen_key, stats in tuple(self._entries):  # a tuple: hooks may run in threads
            if ref() is tensor and seen_key == key:
                return True, stats
        return False, None

    def put(self, tensor: torch.Tensor, step: Any, stats: TensorStats | None) -> None:
        try:
            self._entries.append((weakref.ref(tensor), self._key(tensor, step), stats))
        except TypeError:  # pragma: no cover - a tensor type without weak references
            pass


def tensor_version(tensor: torch.Tensor) -> int:
    try:
        return int(tensor._version)
    except (AttributeError, RuntimeError):  # inference tensors have no version counter
        return -1


_RECENT = _RecentStats()


def cached_stats(event, key: str, tensor: torch.Tensor | None) -> TensorStats | None:
    """``summarize`` once per tensor; every check (and event) asking again gets the same object."""
    if tensor is None:
        return None
    cache = event.cache
    if key not in cache:
        step = getattr(event, "step", None)
        found, stats = _RECENT.get(tensor, step)
        if not found:
            stats = summarize(tensor)
            _RECENT.put(tensor, step, stats)
        cache[key] = stats
    return cache[key]


def cached_item(event: Any, tensor: torch.Tensor) -> float:
    """``tensor.item()`` of a one-element CPU tensor, read once per event: several checks read
    the same loss on every step (N101 its finiteness, L106 its value)."""
    cache = event.cache
    value = cache.get("scalar_item")
    if value is None or value[0] is not tensor:
        value = cache["scalar_item"] = (tensor, tensor.item())
    return value[1]
