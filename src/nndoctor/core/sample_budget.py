"""The sampling budget: sampled steps may cost the user at most a fixed share of the run's time.

A sampled step runs every check's full instrumentation (statistics of activations, gradients
and parameters, many small device reads); on a launch-bound GPU loop of 2 ms steps one costs
≈ 20 ms, and one in 100 steps then adds ≈ 10 % to the run. After each periodic sampled step
this measures what it cost beyond an ordinary step (host wall clock, the sampled step and the
one after it, whose start carries the sampled step's end-of-step handlers, against the median
of the unsampled steps just before) and, when the amortised cost exceeds the budget, doubles
the interval (100, 200, 400, … up to ``MAX_FACTOR`` × the configured one), so long runs of
short steps pay ≈ the budget while steps where sampling is cheap keep the configured interval.

The interval is always the configured one times a power of two, and a wider interval starts at
a step that is a multiple of it: ranks that decide differently still share every step the
coarsest of them sampled (the cross-rank checks compare the steps all ranks recorded). It
narrows again, one halving at a time, when sampled steps become cheap enough with a margin
of 2 (the first ones pay one-time costs: allocations, first calls). The first ``full_window`` steps are
always fully observed. An interval set by the user (``sample-every`` in the configuration,
``NNDOCTOR_SAMPLE_EVERY``) is kept as it is.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

# The share of the run's wall time that sampled steps may cost (0 switches the budget off).
DEFAULT_BUDGET = 0.01
MAX_FACTOR = 16  # at most 1 step in 1,600 with the default interval of 100
BASELINE_STEPS = 6  # unsampled steps timed before each periodic sampled step
_KEPT_COSTS = 8  # the last sampled steps' costs: the decisions read 3, the report all
_ENV = "NNDOCTOR_SAMPLE_BUDGET"


def budget_from_env() -> float:
    """The budget from ``NNDOCTOR_SAMPLE_BUDGET`` (a fraction, e.g. 0.01), else the default."""
    try:
        return max(0.0, float(os.environ.get(_ENV, DEFAULT_BUDGET)))
    except ValueError:
        return DEFAULT_BUDGET


class SampleBudget:
    """Times the steps around each periodic sampled step of one session and widens its
    ``sample_every`` when the sampled steps cost more than ``budget`` of the time."""

    def __init__(self, session: Any, budget: float) -> None:
        self.session = session
        self.budget = budget
        self.base = session.sample_every
        self.limit = self.base * MAX_FACTOR
        self._last_end: float | None = None
        self._baseline: list[float] = []  # intervals of the unsampled steps before the next sample
        self._sampled_interval: float | None = None
        self._target: int = session.sample_every  # the interval the measured costs call for
        self.costs: list[float] = []  # seconds each periodic sampled step cost beyond its neighbours
        self.changes: list[tuple[int, int]] = []  # (step, new interval)
        self.clock = time.perf_counter

    def step_ended(self, step: int, sampled: bool) -> None:
        """After ``optimizer.step()`` of ``step`` (0-based) returned: every step, so cheap. Only
        the steps around a periodic sample are timed: the baseline before it (and the step that
        starts the baseline's first interval), the sampled step and the one after."""
        session = self.session
        every = session.sample_every
        phase = step % every
        if 1 < phase < every - BASELINE_STEPS - 1 or step < session.full_window:
            return  # most steps: nothing to time
        now = self.clock()
        last, self._last_end = self._last_end, now
        if last is None:
            return
        if phase >= every - BASELINE_STEPS and not sampled:
            if phase == every - BASELINE_STEPS:
                self._baseline.clear()
            self._baseline.append(now - last)
        elif phase == 0 and sampled:
            self._sampled_interval = now - last
        elif phase == 1 and self._sampled_interval is not None:
            self._measured(step - 1, self._sampled_interval + (now - last))
            self._sampled_interval = None

    def _measured(self, sampled_step: int, two_steps: float) -> None:
        if len(self._baseline) < 3:
            return  # a phase change, a new optimizer: no clean baseline this time
        typical = statistics.median(self._baseline)
        self._baseline.clear()
        self.costs.append(max(0.0, two_steps - 2 * typical))
        del self.costs[:-_KEPT_COSTS]
        session = self.session
        every = session.sample_every
        if typical > 0 and len(self.costs) >= 2:
            # The cheaper of the last two: a checkpoint or an evaluation that happened to fall
            # in one sampled step is not the checks' cost.
            cost = min(self.costs[-2:])
            target = self.base
            while target < self.limit and cost > self.budget * target * typical:
                target *= 2
            if target >= every:
                self._target = target
            elif len(self.costs) >= 3 and 2 * max(self.costs[-3:]) <= self.budget * (every // 2) * typical:
                # Cheaper now (the first sampled steps pay one-time costs): narrow again when
                # the last three all fit twice over, so that noise does not swing the interval.
                self._target = every // 2
                session.sample_every = every // 2
                self.changes.append((sampled_step, every // 2))
                return
            else:
                self._target = every  # cheaper, not yet by a margin: neither wider nor narrower
        # Widen step by step, each new interval starting at a step that is its multiple
        # (100, 200, 400, ...): the sampled steps thin out gradually, log-spaced.
        while every < self._target and sampled_step % (every * 2) == 0:
            every *= 2
        if every != session.sample_every:
            session.sample_every = every
            self.changes.append((sampled_step, every))

    def summary(self) -> dict[str, Any]:
        """For the report: how often steps were sampled, and why the interval changed."""
        return {
            "budget": self.budget,
            "configured": self.base,
            "sample_every": self.session.sample_every,
            "changes": [{"step": step, "sample_every": every} for step, every in self.changes],
            "sampled_step_cost_ms": [round(cost * 1000, 3) for cost in self.costs],
        }
