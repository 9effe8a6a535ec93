"""What the hooks write on every step instead of sending an event: when each optimizer step
ended (``StepLog``), and how long the loop waited for each DataLoader (``LoaderTally``).

P114 (step-time outliers) times every step. It used to do that in a handler of every step's
end — an event built and a call made on every step, for a clock read and three subtractions.
The hook that ends the step has the clock read already (``RunState.last_step_end``): it adds
one row here instead, and P114 turns the rows into step times at the end of the run.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

FIELDS = 5  # per step: end (perf_counter s), GC seconds so far, data-wait seconds so far, step count, sampled


class _NoClock:
    seconds = 0.0


class StepLog:
    """Rows of (end, GC seconds so far, DataLoader wait so far, steps counted, sampled), one per
    optimizer step, up to ``limit`` rows (a C array of doubles: 40 bytes a step)."""

    __slots__ = ("values", "limit", "_clock", "_find_clock")

    def __init__(self, limit: int, find_clock: Callable[[], Any]) -> None:
        self.values = array("d")
        self.limit = limit * FIELDS
        self._clock: Any = None
        self._find_clock = find_clock  # the session's GC clock, looked up at the first row

    def add(self, end: float, wait: float, step: int, sampled: bool) -> None:
        """One row; the caller (the optimizer hook) stops calling once ``limit`` is reached."""
        clock = self._clock
        if clock is None:
            clock = self._clock = self._find_clock() or _NoClock
        self.values.extend((end, clock.seconds, wait, step, sampled))

    def __len__(self) -> int:
        return len(self.values) // FIELDS

    def rows(self) -> list[tuple[float, float, float, int, bool]]:
        v = self.values
        return [(v[i], v[i + 1], v[i + 2], int(v[i + 3]), bool(v[i + 4])) for i in range(0, len(v), FIELDS)]


class LoaderTally:
    """The batches a DataLoader gave and the seconds the loop waited for them, over all its
    passes, added by the DataLoader hook (P102 reads them on sampled steps and at the end)."""

    __slots__ = ("batches", "wait")

    def __init__(self) -> None:
        self.batches = 0
        self.wait = 0.0
