"""Pure helpers over optimizer and model parameters, shared by the optimizer checks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from nndoctor.util.dtensor import local_tensor


def optimizer_params(optimizer: Any) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def has_any_grad(optimizer: Any) -> bool:
    """Does any parameter of the optimizer hold a gradient? Reads no tensor data (no sync)."""
    groups = optimizer.param_groups
    if groups and groups[0]["params"] and groups[0]["params"][0].grad is not None:
        return True  # the usual step (asked on every step): no generator to run
    return any(p.grad is not None for group in optimizer.param_groups for p in group["params"])


def spread_sample(items: list[Any], k: int = 8) -> list[Any]:
    """Up to ``k`` items spread evenly over the list (first and last included)."""
    if len(items) <= k:
        return list(items)
    step = (len(items) - 1) / (k - 1)
    return [items[round(i * step)] for i in range(k)]


def grad_slice(p: torch.Tensor, n: int = 64) -> torch.Tensor | None:
    """A small copy of the start of a gradient (cheap fingerprint; no host sync)."""
    g = p.grad
    if g is None or g.is_sparse:
        return None
    return local_tensor(g.detach()).reshape(-1)[:n].clone()


def value_slice(p: torch.Tensor, n: int = 64) -> torch.Tensor:
    """A small copy of the start of a parameter (of this rank's shard for a DTensor)."""
    return local_tensor(p.detach()).reshape(-1)[:n].clone()


def learning_rates(optimizer: Any) -> list[float]:
    return [float(g.get("lr", float("nan"))) if not torch.is_tensor(g.get("lr")) else float(g["lr"])
            for g in optimizer.param_groups]


def named_params_of(roots: Iterable[Any]) -> dict[int, str]:
    """id(param) -> "Model.layer.weight" for every parameter of the given root modules."""
    names: dict[int, str] = {}
    for root in roots:
        prefix = type(root).__name__
        for name, p in root.named_parameters():
            names.setdefault(id(p), f"{prefix}.{name}")
    return names


def scaler_enabled(scaler: Any) -> bool:
    """Is a GradScaler enabled? A scaler whose state can't be read counts as enabled (N101, N105)."""
    try:
        return bool(scaler.is_enabled())
    except Exception:  # noqa: BLE001 - a third-party scaler: assume it scales
        return True
