"""Debugging left on during training: P116 anomaly detection, a profiler recording every step,
gradcheck inside the training loop."""

from __future__ import annotations

import statistics
import time

import torch

from nndoctor.core.events import DebugModeSet, RunEnd, StepEnd
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register


def step_time_comparison(on: list[tuple[bool, float]], off: list[tuple[bool, float]]) -> tuple[float, float] | None:
    """(median step seconds with the mode on, with it off), comparing steps of the same kind
    (nndoctor's sampled steps cost more than the others); None when there is nothing to compare."""
    for sampled in (False, True):
        with_mode = [t for s, t in on if s == sampled]
        without = [t for s, t in off if s == sampled]
        if with_mode and without:
            return statistics.median(with_mode), statistics.median(without)
    return None


@register
class DebugModeLeftOn(Check):
    """
    ## What it does
    Reads ``torch.is_anomaly_enabled()`` (a flag, no computation) after every optimizer step
    and remembers where user code switched anomaly detection on
    (``torch.autograd.set_detect_anomaly(True)`` or ``with torch.autograd.detect_anomaly():``).
    It also reads, after every step, whether the autograd profiler is recording
    (``torch.profiler.profile`` without a schedule, or in an active window) and reports a
    profiler that recorded **50 consecutive optimizer steps** — at the ``profile`` call.
    It times every ``torch.autograd.gradcheck``/``gradgradcheck`` call and reports
    numerical gradient checks run inside the training loop — in at least **3 different
    optimizer steps** after the first — with their count and share of the run's time; a
    gradcheck before training (a one-off sanity check) stays silent.
    When anomaly detection stayed on for at least **5 optimizer steps**, the run's end
    reports it, with the measured cost when some steps ran without it: the median step
    time with and without the mode, over steps of the same kind (nndoctor's fully
    instrumented steps are compared only with each other).

    ## Why is this bad?
    Anomaly detection records the Python stack of every operation in the forward pass and
    checks every backward function's output for NaN, with a synchronisation per check on
    GPUs. PyTorch documents it as a debugging tool that slows execution; left on after a
    debugging session it commonly makes training several times slower, and nothing in the
    training output shows why. A profiler without a schedule times every operator of every
    step and keeps all its events in memory until the end: slower steps and growing memory.
    ``gradcheck`` compares analytical gradients with finite differences: two evaluations of
    the function per input element, in float64 (PyTorch's docs ask for double precision) —
    for a batch of 16×8 inputs that is 256 extra forwards per call; left in the loop after
    debugging a custom ``autograd.Function``, it dominates the step time.

    ## Example
    ```python
    torch.autograd.set_detect_anomaly(True)    # added while chasing a NaN, never removed
    for x, y in loader:
        ...
    ```

    ## Use instead
    Remove the call, guard it behind a debug flag, or scope it to the step being debugged
    (``with torch.autograd.detect_anomaly(): loss.backward()``). Profile a few steps with
    ``torch.profiler.schedule(wait=1, warmup=1, active=3)`` and ``prof.step()``. The thresholds
    (5 steps with anomaly detection, 50 consecutive profiled steps — a schedule's active
    windows are far shorter, gradchecks in 3 steps of the loop) let deliberate debugging
    pass silently. Run ``torch.autograd.gradcheck`` once on a small double-precision input
    before training or in a unit test.

    ## References
    - PyTorch docs, "Anomaly detection" (``detect_anomaly``: "should be enabled only for debugging as the different tests will slow down your program execution"): https://pytorch.org/docs/stable/autograd.html#anomaly-detection
    - PyTorch Performance Tuning Guide, "Disable debugging APIs": https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    - PyTorch docs, ``torch.autograd.gradcheck`` (finite differences; double-precision inputs): https://pytorch.org/docs/stable/generated/torch.autograd.gradcheck.gradcheck.html
    - PyTorch docs, "Extending torch.autograd" (check a custom Function with gradcheck once): https://pytorch.org/docs/stable/notes/extending.html
    - PyTorch docs, ``torch.profiler.schedule`` (profile long jobs in windows): https://pytorch.org/docs/stable/profiler.html#torch.profiler.schedule
    """

    code = "P116"
    name = "debug-mode-left-on"
    severity = Severity.WARNING
    summary = "anomaly detection, a profiler or gradcheck left on during training"
    fix = "remove torch.autograd.set_detect_anomaly(True) (or scope detect_anomaly() to the step being debugged)"
    MIN_STEPS = 5
    PROFILER_MIN_STEPS = 50
    MAX_TIMES = 2000
    # Steps timed without anomaly detection, the baseline of the slowdown in the message. Once
    # this many are in and nothing is on, the handler runs on sampled steps only (a legacy
    # profiler is seen there; anomaly detection and torch.profiler announce themselves).
    MAX_OFF_TIMES = 256
    GRADCHECK_MIN_STEPS = 3

    def __init__(self, session) -> None:
        super().__init__(session)
        self._where: Location | None = None
        self._last_end: float | None = None
        self._on: list[tuple[bool, float]] = []
        self._off: list[tuple[bool, float]] = []
        self._first_step: int | None = None
        self._steps_on = 0
        self._profiler_where: Location | None = None
        self._profiled_run = 0  # consecutive optimizer steps with the profiler recording
        self._profiled_longest: tuple[int, int] = (0, 0)  # (steps, first step)
        self._started = time.perf_counter()
        self._gradchecks: list[tuple[int, float, Location | None]] = []  # (step, seconds, where)
        self._quiet = False  # on_step_end on sampled steps only (``Session.every_step``)

    def _wake(self) -> None:
        if self._quiet:
            self._quiet = False
            self._last_end = None  # the time since the last sampled step is no step's time
            self.session.every_step(self, True, "step_end")

    def on_debug_mode(self, event: DebugModeSet) -> None:
        if event.enabled:
            self._wake()
        if event.enabled and event.mode == "anomaly" and self._where is None:
            self._where = event.location
        elif event.enabled and event.mode == "profiler" and self._profiler_where is None:
            self._profiler_where = event.location
        elif event.mode in ("gradcheck", "gradgradcheck") and len(self._gradchecks) < self.MAX_TIMES:
            self._gradchecks.append((event.step, event.seconds, event.location))

    def on_step_end(self, event: StepEnd) -> None:
        now = time.perf_counter()
        enabled = torch.is_anomaly_enabled()
        if self._quiet:
            if not enabled and not self._profiler_enabled():
                self._last_end = now
                return
            self._wake()  # switched on without an event (a legacy profiler): every step again
        if self._last_end is not None:
            times = self._on if enabled else self._off
            if len(times) < (self.MAX_TIMES if enabled else self.MAX_OFF_TIMES):
                times.append((event.sampled, now - self._last_end))
        self._steps_on += enabled
        if self._profiled_run or self._profiler_enabled():  # _count_profiled, its usual case inlined
            self._count_profiled(event.step)
        if enabled and self._first_step is None:
            self._first_step = event.step - 1  # step_end counts the step that just ran
        self._last_end = now
        if not enabled and not self._profiled_run and len(self._off) >= self.MAX_OFF_TIMES:
            self._quiet = True
            self.session.every_step(self, False, "step_end")

    # Looked up once (asked on every step); None where this torch has no such probe.
    _profiler_enabled = staticmethod(getattr(torch._C._autograd, "_profiler_enabled", None) or (lambda: False))

    def _count_profiled(self, step: int) -> None:
        probe = self._profiler_enabled
        if probe is not None and probe():
            self._profiled_run += 1
            if self._profiled_run > self._profiled_longest[0]:
                self._profiled_longest = (self._profiled_run, step - self._profiled_run)
        else:
            self._profiled_run = 0

    def _report_gradchecks(self, event: RunEnd) -> None:
        in_training = [(step, seconds, where) for step, seconds, where in self._gradchecks if step >= 1]
        steps_with = sorted({step for step, _, _ in in_training})
        if len(steps_with) < self.GRADCHECK_MIN_STEPS:
            return
        total = sum(seconds for _, seconds, _ in in_training)
        run = max(time.perf_counter() - self._started, 1e-9)
        where = next((w for _, _, w in in_training if w is not None), None)
        self.report(
            f"torch.autograd.gradcheck ran {len(in_training)} times during training, in {len(steps_with)} "
            f"different optimizer steps (from step {steps_with[0]}): {total:.2f} s, {100 * total / run:.0f}% "
            f"of the run's {run:.2f} s. Each call evaluates the function twice per input element "
            "(finite differences), in float64.",
            location=where or event.location,
            evidence={"gradcheck_calls": len(in_training), "steps_with_gradcheck": len(steps_with),
                      "gradcheck_seconds": round(total, 4), "run_seconds": round(run, 4),
                      "share_of_run": round(total / run, 4)},
            fix="run gradcheck once, before training (or in a unit test), on a small input; remove it from "
                "the training loop",
            step=steps_with[0],
        )

    def on_run_end(self, event: RunEnd) -> None:
        self._report_gradchecks(event)
        steps, first = self._profiled_longest
        if steps >= self.PROFILER_MIN_STEPS:
            self.report(
                f"A profiler recorded {steps} consecutive optimizer steps (from step {first}) without a "
                "schedule: every operation is timed and its events are kept in memory for the whole run.",
                location=self._profiler_where or event.location,
                evidence={"profiled_consecutive_steps": steps, "from_step": first},
                fix="profile a few steps with torch.profiler.schedule(wait=…, warmup=…, active=…) and prof.step(), "
                    "or remove the profiler",
                step=first,
            )
        if self._steps_on < self.MIN_STEPS or self._first_step is None:
            return
        compared = step_time_comparison(self._on, self._off)
        cost = ""
        on_s: float | None = None
        off_s: float | None = None
        if compared:
            on_s, off_s = compared
            cost = (f"; steps took {on_s * 1000:.1f} ms (median) with it on, against {off_s * 1000:.1f} ms without "
                    f"({on_s / off_s:.1f}×)")
        self.report(
            f"Anomaly detection (torch.autograd.set_detect_anomaly) was on for {self._steps_on} optimizer "
            f"steps, from step {self._first_step}: it records a stack trace for every operation and checks "
            f"every gradient{cost}.",
            location=self._where or event.location,
            evidence={"steps_with_anomaly_detection": self._steps_on,
                      "median_step_ms_on": round(on_s * 1000, 3) if on_s else None,
                      "median_step_ms_off": round(off_s * 1000, 3) if off_s else None},
            step=self._first_step,
        )
