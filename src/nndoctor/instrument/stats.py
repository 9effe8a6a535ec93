"""Tensor statistics computed once per sampled event and shared by every check.

One fused reduction per tensor, copied to the host with a single synchronisation. Checks
are pure functions of these numbers, so they can be unit-tested without a training loop.
"""

from __future__ import annotations

import math
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


def _nan_to_num_stats(flat: torch.Tensor) -> torch.Tensor:
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


def summarize(tensor: torch.Tensor, channels: bool = True) -> TensorStats | None:
    """Statistics of a tensor, or None for empty/complex/unsupported tensors."""
    if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0 or tensor.is_complex():
        return None
    if tensor.is_sparse or tensor.is_nested or tensor.device.type == "meta":
        return None
    with torch.no_grad(), torch.autocast(tensor.device.type, enabled=False):
        x = tensor.detach()
        floating = x.is_floating_point()
        flat = x.reshape(-1)
        if floating:
            head = _nan_to_num_stats(flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat)
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
            c1 = xf.shape[1]
            cl = xf.shape[-1]
            parts += [xf.mean(dim=(0, 2, 3)).double(), xf.std(dim=(0, 2, 3)).double() if xf[:, 0].numel() > 1
                      else torch.zeros(c1, dtype=torch.float64, device=x.device)]
            parts += [xf.mean(dim=(0, 1, 2)).double(), xf.std(dim=(0, 1, 2)).double() if xf[..., 0].numel() > 1
                      else torch.zeros(cl, dtype=torch.float64, device=x.device)]
        values = torch.cat([p.reshape(-1) for p in parts]).cpu().tolist()  # the one sync
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


def cached_stats(event, key: str, tensor: torch.Tensor | None) -> TensorStats | None:
    """``summarize`` once per event and key; every check asking again gets the same object."""
    if tensor is None:
        return None
    cache = event.cache
    if key not in cache:
        cache[key] = summarize(tensor)
    return cache[key]
