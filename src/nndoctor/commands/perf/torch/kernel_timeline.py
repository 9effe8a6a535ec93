"""Kernel-level GPU busy time: a torch.profiler timeline over a few steps.

CUDA events around a step measure the span from its first to its last kernel, an upper
bound on the GPU's busy time: when the host paces the kernels (a launch-bound step), the
gaps between them count as busy. The profiler's kernel timeline gives the union of the
kernel intervals instead, and the idle time between them can be split, as Holistic Trace
Analysis's idle-time breakdown does, by what the host was doing: waiting for the next batch
(DataLoader ``__next__``) or anything else (launching kernels, Python, syncs) — host overhead.

The profiled steps are the last warm-up steps, so the measured window keeps its timings
(the profiler adds host overhead to the steps it watches).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Interval = tuple[float, float]
PROFILED_STEPS = 3  # warm-up steps profiled, when the warm-up is long enough
MIN_UNPROFILED_WARMUP = 2
STEP_MARK = "nndoctor.step#"  # the record_function range around each profiled step  # first warm-up steps never profiled (allocator, cuDNN autotuning, compilation)


def merge(intervals: list[Interval]) -> list[Interval]:
    """Sorted, non-overlapping union of intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def overlap(intervals: list[Interval], window: Interval) -> float:
    """Total length of merged ``intervals`` inside ``window``."""
    lo, hi = window
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in intervals)


def _subtract(window: Interval, covered: list[Interval]) -> list[Interval]:
    """The parts of ``window`` not covered by the merged ``covered`` intervals."""
    gaps, cursor = [], window[0]
    for a, b in covered:
        if b <= cursor or a >= window[1]:
            continue
        if a > cursor:
            gaps.append((cursor, min(a, window[1])))
        cursor = max(cursor, b)
    if cursor < window[1]:
        gaps.append((cursor, window[1]))
    return gaps


def idle_breakdown(steps: list[Interval], kernels: list[Interval], data_waits: list[Interval]) -> dict[str, Any] | None:
    """Fractions of the profiled steps' wall time: kernels running (busy), GPU idle while the
    host waited for data, GPU idle otherwise (host overhead). None without steps."""
    steps = [s for s in steps if s[1] > s[0]]
    if not steps:
        return None
    busy_intervals, waits = merge(kernels), merge(data_waits)
    wall = busy = data_idle = 0.0
    for step in steps:
        wall += step[1] - step[0]
        busy += overlap(busy_intervals, step)
        data_idle += sum(overlap(waits, gap) for gap in _subtract(step, busy_intervals))
    host_idle = max(0.0, wall - busy - data_idle)
    return {"steps": len(steps), "wall_s": wall, "busy_fraction": busy / wall,
            "data_idle_fraction": data_idle / wall, "host_idle_fraction": host_idle / wall,
            "kernels": len(kernels), "measure": "torch.profiler kernel timeline"}


@dataclass
class KernelProfiler:
    """torch.profiler over a few consecutive steps of the user's loop (started and stepped from
    the perf recorder's step-end handler)."""

    steps: int = PROFILED_STEPS
    # Also measure DDP's all-reduce: ``comm(events, STEP_MARK)`` (perf/torch/ddp_comm.py's
    # comm_from_events), on CPU (gloo) too, where no kernel runs.
    comm: Any = None
    cuda: bool = True
    comm_result: dict[str, Any] | None = None
    # Read the events only when ``analyze`` is called: under DDP reading them at the end of the
    # warm-up would hold this rank up, and the other ranks would wait for it in the all-reduce
    # of the first measured step.
    defer: bool = False
    stopped: Any = None
    profiler: Any = None
    seen: int = 0
    _marker: Any = None  # the record_function range of the step in progress
    result: dict[str, Any] | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda and torch.cuda.is_available()
                                               else [])
        try:
            # One start/stop cycle, so accumulating costs nothing; without it torch warns on the
            # user's stderr that "Profiler clears events at the end of each cycle".
            self.profiler = profile(activities=activities, acc_events=True)
        except TypeError:  # torch < 2.4 has no acc_events (and no such warning)
            self.profiler = profile(activities=activities)
        self.profiler.start()
        self._open_marker()

    def _open_marker(self) -> None:
        from torch.autograd.profiler import record_function

        self._marker = record_function(f"{STEP_MARK}{self.seen}")
        self._marker.__enter__()

    def _close_marker(self) -> None:
        if self._marker is not None:
            marker, self._marker = self._marker, None
            marker.__exit__(None, None, None)

    def step_ended(self) -> bool:
        """Mark a step boundary; True once the profiled steps are done (the result is ready)."""
        self._close_marker()
        self.seen += 1
        if self.seen < self.steps:
            self._open_marker()
            return False
        import torch

        if self.cuda and torch.cuda.is_available():
            torch.cuda.synchronize()  # every kernel of the profiled steps has ended
        self.profiler.stop()
        self.stopped, self.profiler = self.profiler, None
        if not self.defer:
            self.analyze()
        return True

    def analyze(self) -> None:
        """The results from the stopped profiler's events (once)."""
        if self.stopped is None:
            return
        profiler, self.stopped = self.stopped, None
        events = profiler.events()
        if self.cuda:
            self.result = idle_breakdown(*timeline_intervals(events))
        if self.comm is not None:
            self.comm_result = self.comm(events, STEP_MARK) or {
                "missing": "no all-reduce in the profiled steps (a comm hook, or no gradient synchronised)"}

    def abandon(self) -> None:
        self._close_marker()
        if self.profiler is not None:
            profiler, self.profiler = self.profiler, None
            profiler.stop()


def timeline_intervals(events: Any) -> tuple[list[Interval], list[Interval], list[Interval]]:
    """(profiler steps, kernels, DataLoader waits) in seconds from the profiler's events."""
    from torch.autograd import DeviceType

    steps, kernels, waits = [], [], []
    for event in events:
        span = (event.time_range.start / 1e6, event.time_range.end / 1e6)
        name = event.name
        if event.device_type == DeviceType.CUDA:
            kernels.append(span)
        elif name.startswith(STEP_MARK):
            steps.append(span)
        elif name.startswith("enumerate(DataLoader)"):
            waits.append(span)
    return steps, kernels, waits
