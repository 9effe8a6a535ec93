"""Reproducibility of timing-based findings (P102, C105).

A share of wall time measured once varies between runs (other processes, caches, CPU
frequency): a finding that appears in one run and not in the next costs trust. A timing
finding is a warning only when it is well clear of its threshold — overall at least
``margin`` × the threshold, *and* above the threshold in each half of the run taken alone
(the spread inside a run stands for the spread between runs). A share past the threshold
without that margin is reported as info, with the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

from nndoctor.core.findings import Severity

MARGIN = 1.5


def share_in_halves(events: Sequence[tuple[float, float]], start: float, end: float) -> tuple[float, float] | None:
    """Share of wall time spent in timed events (``(finished_at, seconds)``) in each half of
    ``[start, end]``; None when the interval is empty."""
    if end <= start:
        return None
    middle = (start + end) / 2
    first = sum(seconds for at, seconds in events if at <= middle)
    second = sum(seconds for at, seconds in events if at > middle)
    half = (end - start) / 2
    return first / half, second / half


def timing_severity(overall: float, halves: tuple[float, float] | None, threshold: float,
                    margin: float = MARGIN) -> Severity | None:
    """WARNING when reproducible, INFO when past the threshold without the margin, else None."""
    if overall < threshold:
        return None
    if halves is not None and min(halves) >= threshold and overall >= threshold * margin:
        return Severity.WARNING
    return Severity.INFO
