"""L106's trend test over a run's training losses: pure math on a list of floats, shared by the
PyTorch check and the Keras/TensorFlow observers (imports neither framework)."""

from __future__ import annotations

import math
from collections.abc import Sequence

TREND_MIN_POINTS = 30
TREND_MIN_STEPS = 30  # optimizer steps the observed losses must span
# Losses kept per series: beyond this, the resolution is halved (``halved``).
MAX_TREND_VALUES = 4096


def halved(values: list[float]) -> list[float]:
    """A long series at half the resolution (two neighbours averaged): the whole window is kept."""
    return [(values[i] + values[i + 1]) / 2 for i in range(0, len(values) - 1, 2)]
NOT_DECREASING_Z = -1.645  # no decrease significant at 5% (one-sided)
NOT_DECREASING_RATIO = 0.99  # and the last third's median is not 1% below the first third's
DIVERGING_Z = 2.326  # increase significant at 1% (one-sided)
DIVERGING_RATIO = 1.5
# A loss whose first values are at least this many times its last third's median has already
# converged: the trend of the plateau that follows a fall of an order of magnitude says nothing
# about whether the model learns (the first third can hold the plateau too, when the fall is quick).
CONVERGED_DROP = 10.0
CONVERGED_HEAD = 3  # the first values whose mean is compared
# A loss whose last third's median is this many times its first value has diverged, whatever its
# trend since: a learning rate far too high throws the loss up within a few steps, after which it
# may drift down again (and the trend test sees a decrease).
JUMP_RATIO = 100.0


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


def last_third_median(values: Sequence[float]) -> float:
    import statistics

    return statistics.median(values[-max(1, len(values) // 3):])


def jump_ratio(values: Sequence[float]) -> float:
    """The last third's median over the first value (the loss before any update); 1 when the
    first value is 0."""
    first = values[0]
    return last_third_median(values) / first if first > 0 else 1.0


def converged_drop(values: Sequence[float]) -> float:
    """The mean of the first ``CONVERGED_HEAD`` values over the last third's median."""
    head = values[:CONVERGED_HEAD]
    last = last_third_median(values)
    return (sum(head) / len(head)) / last if last > 0 else math.inf


def loss_trend(values: Sequence[float]) -> tuple[str, float, float] | None:
    """("not-decreasing" | "diverging" | "jumped", z, ratio) or None when the loss goes down (or
    has already fallen by an order of magnitude and sits on its floor). ``ratio`` is the
    thirds ratio, or for "jumped" the last third's median over the first value."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < TREND_MIN_POINTS or min(finite) < 0:
        return None  # negative losses (log-likelihoods, GAN objectives) have no "down" to test
    z, ratio = mann_kendall_z(finite), thirds_ratio(finite)
    jump = jump_ratio(finite)
    if jump >= JUMP_RATIO:
        return "jumped", z, jump
    if z > DIVERGING_Z and ratio > DIVERGING_RATIO:
        return "diverging", z, ratio
    if z > NOT_DECREASING_Z and ratio > NOT_DECREASING_RATIO and converged_drop(finite) < CONVERGED_DROP:
        return "not-decreasing", z, ratio
    return None


def trend_sentence(kind: str, z: float, ratio: float, n: int, subject: str = "the training loss",
                   values: Sequence[float] = ()) -> str:
    """L106's statement of a ``loss_trend`` verdict with its numbers and thresholds (PyTorch
    and Keras say it the same way; ``subject`` names whose loss it is; ``values``, the losses
    judged, give the "jumped" verdict its two levels)."""
    if kind == "jumped":
        finite = [v for v in values if math.isfinite(v)]
        levels = (f" (first loss {finite[0]:.3g}, last-third median {last_third_median(finite):.3g})"
                  if finite else "")
        return (f"{subject} diverged: over {n} losses it ends {ratio:.3g}× above its first value{levels}, "
                f"threshold {JUMP_RATIO:g}× — a loss orders of magnitude above where it started has blown up, "
                f"even if it drifts down again afterwards")
    if kind == "diverging":
        return (f"{subject} rises: Mann–Kendall z = {z:.2f} over {n} losses (threshold > {DIVERGING_Z}), "
                f"last-third median {ratio:.2f}× the first third's (threshold {DIVERGING_RATIO}×)")
    return (f"{subject} does not go down: Mann–Kendall z = {z:.2f} over {n} losses (a decrease "
            f"needs z < {NOT_DECREASING_Z}), last-third median {ratio:.3f}× the first third's "
            f"(needs < {NOT_DECREASING_RATIO})")
