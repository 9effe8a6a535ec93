"""``python -m nndoctor.commands.perf.torch.rerun_child``: one ``--try`` timing — the user's script run again,
unchanged, with the given changes injected, for a warm-up plus a measured window.

Prints nothing of its own; writes one JSON object to ``--out``: seconds per step over the
window (the device drained at both ends), the samples the DataLoader delivered in it and the
peak GPU memory, the first loss and the loss after the window, the changes actually applied
(and why not, where not), or the error that stopped the script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from nndoctor.commands.perf.torch.inject import ChangeInjector
from nndoctor.core.engine import Session, StopRun
from nndoctor.run.runner import Target, run_target
from nndoctor.util.atomic import atomic_write_text


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _cuda_in_use() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _reset_peak_memory() -> None:
    if _cuda_in_use():
        import torch

        torch.cuda.reset_peak_memory_stats()


def _total_memory() -> int | None:
    if not _cuda_in_use():
        return None
    import torch

    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


def _peak_memory() -> int | None:
    if not _cuda_in_use():
        return None
    import torch

    return int(torch.cuda.max_memory_allocated())


STABLE = 0.10  # two consecutive warm-up steps within 10% of each other: warm
# Set by the perf session when the measured loop is input-bound: the step changes (AMP, channels
# last, compile, ...) act on the step, not on loading, and the loader trial measures loading; so
# each re-run reports its step time without the data wait ("seconds_per_step"), the wall time
# per step beside it ("wall_seconds_per_step").
DATA_WAIT_ENV = "NNDOCTOR_TRY_EXCLUDE_DATA_WAIT"


class StepClock:
    """Times the window between the end of step ``warmup`` and the end of step ``warmup + steps``
    of the first optimizer to step (a GAN's second optimizer steps in the same iteration)."""

    subscriber_name = "perf --try step clock"

    def __init__(self, session: Any, window: tuple[int, int], min_steps: int | None = None,
                 min_warmup: int | None = None) -> None:
        self.session = session
        self.warmup, self.steps = window
        # --min-warmup: the warm-up may end after this many steps, once two consecutive steps
        # took the same time within STABLE (compilation, autotuning and allocator growth done);
        # at the latest it ends after ``warmup`` steps.
        self.min_warmup = max(1, min(min_warmup or self.warmup, self.warmup))
        self._warmup_ends: list[float] = []
        # A script that ends before the window is complete still gives a timing once this
        # many steps were measured (--min-steps; windows are lengthened for very short steps).
        self.min_steps = min(min_steps or self.steps, self.steps)
        self.last_end: float | None = None
        self._last_loss: Any = None
        self.lead: int | None = None
        self.count = 0
        self.started: float | None = None
        self.seconds_per_step: float | None = None
        self.first_loss: float | None = None
        self.final_loss: float | None = None
        self.samples = 0  # DataLoader samples fetched inside the window
        self.peak_memory_bytes: int | None = None
        # Host time inside the window from a step's end to the next batch's arrival: the loop
        # waiting for its DataLoader (measured so an input-bound loop's step changes can be
        # compared without it, see DATA_WAIT_ENV).
        self.data_wait = 0.0
        self._since_step_end: float | None = None

    def on_backward(self, event: Any) -> None:
        tensor = event.tensor
        if tensor is None or getattr(tensor, "numel", lambda: 0)() != 1:
            return
        # Read only outside the timed window: a read is a host-device sync.
        if self.first_loss is None:
            self.first_loss = float(tensor.detach().float())
        elif self.seconds_per_step is not None and self.final_loss is None:
            self.final_loss = float(tensor.detach().float())
        elif self.started is not None and self.seconds_per_step is None:
            self._last_loss = tensor.detach()  # read after the run, if it ends inside the window

    def on_batch(self, event: Any) -> None:
        from nndoctor.commands.perf.torch.recorder import _first_tensor

        if self.started is None or self.seconds_per_step is not None:
            return
        if self._since_step_end is not None:
            self.data_wait += time.perf_counter() - self._since_step_end
            self._since_step_end = None
        tensor = _first_tensor(event.batch)
        self.samples += int(tensor.shape[0]) if tensor is not None and tensor.dim() else 0

    def on_step_end(self, event: Any) -> None:
        if self.lead is None:
            self.lead = id(event.optimizer)
        if id(event.optimizer) != self.lead:
            return
        self.count += 1
        if self.started is None and self.count < self.warmup:
            self._warmup_ends.append(time.perf_counter())
            if self.count >= self.min_warmup and self._stable():
                self.warmup = self.count  # the window starts now
        if self.count == self.warmup and self.started is None:
            _sync()
            _reset_peak_memory()
            self.started = self._since_step_end = time.perf_counter()
        elif self.count == self.warmup + self.steps and self.started is not None:
            _sync()
            self.seconds_per_step = (time.perf_counter() - self.started) / self.steps
            self.peak_memory_bytes = _peak_memory()
            self._since_step_end = None
        elif self.started is not None and self.seconds_per_step is None:
            self.last_end = self._since_step_end = time.perf_counter()  # no sync inside the window

    def _stable(self) -> bool:
        ends = self._warmup_ends
        if len(ends) < 3:
            return False
        last, before = ends[-1] - ends[-2], ends[-2] - ends[-3]
        return abs(last - before) <= STABLE * max(last, before)

    @property
    def measured_steps(self) -> int:
        return max(0, self.count - self.warmup) if self.started is not None else 0

    def finish_early(self) -> bool:
        """The script ended inside the window: time the steps it ran when there are enough
        (to the last step's end on the host, the device drained only now — the few steps
        still queued then are the error, small against a window of many steps)."""
        if (self.seconds_per_step is not None or self.last_end is None or self.started is None
                or self.measured_steps < self.min_steps):
            return False
        _sync()
        self.seconds_per_step = (self.last_end - self.started) / self.measured_steps
        self.peak_memory_bytes = _peak_memory()
        if self._last_loss is not None:
            self.final_loss = float(self._last_loss.float())
        self._last_loss = None
        return True

    def on_step_start(self, event: Any) -> None:
        if self.final_loss is not None and (self.lead is None or id(event.optimizer) == self.lead):
            raise StopRun("--try window measured")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nndoctor.commands.perf.torch.rerun_child")
    parser.add_argument("--changes", default="")
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--min-warmup", type=int, default=None,
                        help="the warm-up may end after this many steps once step times are stable")
    parser.add_argument("--min-steps", type=int, default=None,
                        help="the fewest measured steps that still count when the script ends early")
    parser.add_argument("--out", required=True)
    parser.add_argument("-m", dest="module")
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.target[1:] if args.target[:1] == ["--"] else args.target
    target = Target(args.module, rest, is_module=True) if args.module else Target(rest[0], rest[1:])
    session = Session(checks=[])
    injector = ChangeInjector(session, [c for c in args.changes.split(",") if c])
    clock = StepClock(session, (max(1, args.warmup), args.steps), args.min_steps, args.min_warmup)
    session.subscribe(injector)
    session.subscribe(clock)
    out_path = os.path.abspath(args.out)
    report = run_target(target, session)
    ended_early = report.status != "crashed" and clock.finish_early()
    measured = args.steps if not ended_early else clock.measured_steps
    seconds_per_step = clock.seconds_per_step
    data_per_step = clock.data_wait / measured if seconds_per_step is not None and measured else None
    if seconds_per_step is not None and data_per_step is not None and os.environ.get(DATA_WAIT_ENV) == "1":
        seconds_per_step = max(seconds_per_step - data_per_step, 1e-9)
    result: dict[str, Any] = {
        "status": report.status,
        "seconds_per_step": seconds_per_step,
        "wall_seconds_per_step": clock.seconds_per_step,
        "data_seconds_per_step": data_per_step,
        "first_loss": clock.first_loss,
        "final_loss": clock.final_loss,
        "steps_seen": clock.count,
        "warmup_steps": clock.warmup,
        "measured_steps": measured if clock.seconds_per_step is not None else 0,
        "samples_per_step": clock.samples / measured if clock.samples and measured else None,
        "peak_memory_bytes": clock.peak_memory_bytes,
        "memory_total_bytes": _total_memory(),
        "applied": injector.applied if injector else [],
        "notes": injector.notes if injector else [],
        "internal_errors": [e.error for e in report.internal_errors],
    }
    if report.status == "crashed" and report.traceback:
        result["error"] = report.traceback.strip().splitlines()[-1][:500]
    elif clock.seconds_per_step is None:
        result["error"] = (f"the script ended after {clock.count} optimizer steps, before the "
                           f"{args.warmup} + {args.steps} steps of the window")
    atomic_write_text(out_path, json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
