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


class TimeBuckets:
    """Seconds of timed events summed into ``count`` buckets of time since ``origin``, for
    ``share_in_halves`` over a run of any length in constant memory: when an event falls past
    the last bucket, neighbouring buckets merge and each covers twice the time. A bucket goes
    to the half holding its middle, so a half's share is off by at most one bucket's seconds
    (1/``count`` of the run at most)."""

    def __init__(self, origin: float, width: float = 0.25, count: int = 64) -> None:
        self.origin, self.width = origin, width
        self.sums = [0.0] * count

    def add(self, at: float, seconds: float) -> None:
        index = int((at - self.origin) / self.width) if at > self.origin else 0
        sums = self.sums
        while index >= len(sums):
            half = len(sums) // 2
            sums[:half] = [sums[2 * i] + sums[2 * i + 1] for i in range(half)]
            sums[half:] = [0.0] * (len(sums) - half)
            self.width *= 2
            index = int((at - self.origin) / self.width)
        sums[index] += seconds

    def halves(self, start: float, end: float) -> tuple[float, float] | None:
        """``share_in_halves`` of the events added, by bucket."""
        if end <= start:
            return None
        middle = (start + end) / 2
        first = second = 0.0
        for i, seconds in enumerate(self.sums):
            if seconds:
                if self.origin + (i + 0.5) * self.width <= middle:
                    first += seconds
                else:
                    second += seconds
        half = (end - start) / 2
        return first / half, second / half

