"""Pure helpers about model structure shared by several checks."""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd


def mode_dependent_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Layers whose output differs between train and eval mode.

    Dropout with p > 0, and BatchNorm that tracks running statistics (with
    ``track_running_stats=False`` BatchNorm uses batch statistics in both modes).
    """
    found: list[tuple[str, nn.Module]] = []
    for name, sub in module.named_modules():
        if isinstance(sub, _DropoutNd) and getattr(sub, "p", 0) > 0:
            found.append((name, sub))
        elif isinstance(sub, _BatchNorm) and sub.track_running_stats:
            found.append((name, sub))
        elif isinstance(sub, (nn.MultiheadAttention,)) and getattr(sub, "dropout", 0) > 0:
            found.append((name, sub))
    return found


def mode_summary(module: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Names of the mode-dependent layers in training mode, and of those in eval mode.

    Plain strings, so a cache of this never keeps the user's modules alive.
    """
    training: list[str] = []
    evaluating: list[str] = []
    for name, sub in mode_dependent_layers(module):
        label = f"{name or '<root>'} ({type(sub).__name__})"
        (training if sub.training else evaluating).append(label)
    return tuple(training), tuple(evaluating)


class ModeCache:
    """Per-module cache of a mode-dependent answer, invalidated by any train()/eval() call."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[int, Any]] = {}

    def get(self, module: nn.Module, generation: int, compute) -> Any:
        hit = self._cache.get(id(module))
        if hit is not None and hit[0] == generation:
            return hit[1]
        value = compute(module)
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[id(module)] = (generation, value)
        return value
