"""``python -m nndoctor.perf.rerun_child``: one ``--try`` timing — the user's script run again,
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

from nndoctor.atomic import atomic_write_text
from nndoctor.engine import Session, StopRun
from nndoctor.perf.inject import ChangeInjector
from nndoctor.runner import Target, run_target


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


class StepClock:
    """Times the window between the end of step ``warmup`` and the end of step ``warmup + steps``
    of the first optimizer to step (a GAN's second optimizer steps in the same iteration)."""

    subscriber_name = "perf --try step clock"

    def __init__(self, session: Any, window: tuple[int, int]) -> None:
        self.session = session
        self.warmup, self.steps = window
        self.lead: int | None = None
        self.count = 0
        self.started: float | None = None
        self.seconds_per_step: float | None = None
        self.first_loss: float | None = None
        self.final_loss: float | None = None
        self.samples = 0  # DataLoader samples fetched inside the window
        self.peak_memory_bytes: int | None = None

    def on_backward(self, event: Any) -> None:
        tensor = event.tensor
        if tensor is None or getattr(tensor, "numel", lambda: 0)() != 1:
            return
        # Read only outside the timed window: a read is a host-device sync.
        if self.first_loss is None:
            self.first_loss = float(tensor.detach().float())
        elif self.seconds_per_step is not None and self.final_loss is None:
            self.final_loss = float(tensor.detach().float())

    def on_batch(self, event: Any) -> None:
        from nndoctor.perf.recorder import _first_tensor

        if self.started is None or self.seconds_per_step is not None:
            return
        tensor = _first_tensor(event.batch)
        self.samples += int(tensor.shape[0]) if tensor is not None and tensor.dim() else 0

    def on_step_end(self, event: Any) -> None:
        if self.lead is None:
            self.lead = id(event.optimizer)
        if id(event.optimizer) != self.lead:
            return
        self.count += 1
        if self.count == self.warmup:
            _sync()
            _reset_peak_memory()
            self.started = time.perf_counter()
        elif self.count == self.warmup + self.steps and self.started is not None:
            _sync()
            self.seconds_per_step = (time.perf_counter() - self.started) / self.steps
            self.peak_memory_bytes = _peak_memory()

    def on_step_start(self, event: Any) -> None:
        if self.final_loss is not None and (self.lead is None or id(event.optimizer) == self.lead):
            raise StopRun("--try window measured")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nndoctor.perf.rerun_child")
    parser.add_argument("--changes", default="")
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("-m", dest="module")
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.target[1:] if args.target[:1] == ["--"] else args.target
    target = Target(args.module, rest, is_module=True) if args.module else Target(rest[0], rest[1:])
    session = Session(checks=[])
    injector = ChangeInjector(session, [c for c in args.changes.split(",") if c])
    clock = StepClock(session, (max(1, args.warmup), args.steps))
    session.subscribe(injector)
    session.subscribe(clock)
    out_path = os.path.abspath(args.out)
    report = run_target(target, session)
    result: dict[str, Any] = {
        "status": report.status,
        "seconds_per_step": clock.seconds_per_step,
        "first_loss": clock.first_loss,
        "final_loss": clock.final_loss,
        "steps_seen": clock.count,
        "samples_per_step": clock.samples / args.steps if clock.samples else None,
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
