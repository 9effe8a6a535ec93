"""Which torch optimizer really steps: wrappers (accelerate, DeepSpeed, Lightning) forward to an
inner optimizer through an ``.optimizer`` attribute, and torch's step hooks fire on the inner one.

Everything that identifies an optimizer (step counts, a scheduler's optimizer) goes through
``unwrap_optimizer`` so the wrapper and the optimizer it wraps are one optimizer.
"""

from __future__ import annotations

from typing import Any

_MAX_DEPTH = 8  # a wrapper of a wrapper ... (accelerate over Lightning over torch): bounded


def unwrap_optimizer(optimizer: Any) -> Any:
    """The innermost object reached through ``.optimizer`` links that still has param_groups.

    ``accelerate.optimizer.AcceleratedOptimizer`` (what ``accelerator.prepare`` returns, and
    what HF Trainer's scheduler holds) keeps the real optimizer in ``.optimizer``; so do
    Lightning's ``LightningOptimizer`` (``._optimizer``) and DeepSpeed's wrappers.
    """
    current = optimizer
    for _ in range(_MAX_DEPTH):
        inner = None
        for attribute in ("optimizer", "_optimizer"):
            try:
                candidate = current.__dict__.get(attribute)
            except AttributeError:  # objects with __slots__
                candidate = None
            if candidate is not None and candidate is not current and hasattr(candidate, "param_groups"):
                inner = candidate
                break
        if inner is None:
            return current
        current = inner
    return current
