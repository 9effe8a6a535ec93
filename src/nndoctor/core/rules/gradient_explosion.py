"""O104's rule, shared by the PyTorch check and its Keras variant: is the latest total gradient
norm explosive? Pure numbers (no framework), so a TensorFlow-only install uses the same
thresholds as the PyTorch check."""

from __future__ import annotations

import statistics

# The latest norm explodes at this many times the median of the first sampled steps…
EXPLOSION_GROWTH = 1e3
# …or above this outright.
EXPLOSION_HUGE = 1e5


def explosion_verdict(norms: list[float], growth: float = EXPLOSION_GROWTH, huge: float = EXPLOSION_HUGE,
                      baseline_steps: int = 3) -> tuple[str, float, float] | None:
    """("growth"|"huge", current norm, baseline) when the latest total norm is explosive.

    ``norms`` are the finite total gradient norms of the sampled steps so far, oldest first.
    The baseline is the median of the first ``baseline_steps``; the latest norm explodes when
    it is ``growth`` times the baseline, or above ``huge`` outright.
    """
    if not norms:
        return None
    current = norms[-1]
    if len(norms) > baseline_steps:
        baseline = statistics.median(norms[:baseline_steps])
        if baseline > 0 and current >= growth * baseline:
            return ("growth", current, baseline)
    if current >= huge:
        baseline = statistics.median(norms[:baseline_steps])
        return ("huge", current, baseline)
    return None
