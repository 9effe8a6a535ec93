"""L106's trend test over a run's training losses: pure math on a list of floats, shared by the
PyTorch check and the Keras/TensorFlow observers (imports neither framework)."""

from __future__ import annotations

import math
from collections.abc import Sequence

TREND_MIN_POINTS = 30
TREND_MIN_STEPS = 30  # optimizer steps the observed losses must span
NOT_DECREASING_Z = -1.645  # no decrease significant at 5% (one-sided)
NOT_DECREASING_RATIO = 0.99  # and the last third's median is not 1% below the first third's
DIVERGING_Z = 2.326  # increase significant at 1% (one-sided)
DIVERGING_RATIO = 1.5


def mann_kendall_z(values: Sequence[float]) -> float:
    """Mann–Kendall trend statistic (normal approximation, continuity-corrected)."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n < 3:
        return 0.0
    diff = np.sign(x[None, :] - x[:, None])
    s = float(np.triu(diff, k=1).sum())
    var = n * (n - 1) * (2 * n + 5) / 18.0
    if s == 0 or var <= 0:
        return 0.0
    return (s - math.copysign(1.0, s)) / math.sqrt(var)


def thirds_ratio(values: Sequence[float]) -> float:
    """Median of the last third over the median of the first third."""
    import statistics

    third = max(1, len(values) // 3)
    first, last = statistics.median(values[:third]), statistics.median(values[-third:])
    if first == 0:
        return 1.0 if last == 0 else math.inf
    return last / first


def loss_trend(values: Sequence[float]) -> tuple[str, float, float] | None:
    """("not-decreasing" | "diverging", z, ratio) or None when the loss goes down."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < TREND_MIN_POINTS or min(finite) < 0:
        return None  # negative losses (log-likelihoods, GAN objectives) have no "down" to test
    z, ratio = mann_kendall_z(finite), thirds_ratio(finite)
    if z > DIVERGING_Z and ratio > DIVERGING_RATIO:
        return "diverging", z, ratio
    if z > NOT_DECREASING_Z and ratio > NOT_DECREASING_RATIO:
        return "not-decreasing", z, ratio
    return None


def trend_sentence(kind: str, z: float, ratio: float, n: int, subject: str = "the training loss") -> str:
    """L106's statement of a ``loss_trend`` verdict with its numbers and thresholds (PyTorch
    and Keras say it the same way; ``subject`` names whose loss it is)."""
    if kind == "diverging":
        return (f"{subject} rises: Mann–Kendall z = {z:.2f} over {n} losses (threshold > {DIVERGING_Z}), "
                f"last-third median {ratio:.2f}× the first third's (threshold {DIVERGING_RATIO}×)")
    return (f"{subject} does not go down: Mann–Kendall z = {z:.2f} over {n} losses (a decrease "
            f"needs z < {NOT_DECREASING_Z}), last-third median {ratio:.3f}× the first third's "
            f"(needs < {NOT_DECREASING_RATIO})")
