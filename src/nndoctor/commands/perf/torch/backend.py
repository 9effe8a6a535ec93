"""The PyTorch perf backend: the recorder subscribed to the session's events, the ``--try`` trials
at the end of the measured window (while the user's objects are alive), and the window's result.

Under torchrun every rank has its backend; rank 0 decides what is re-run and the other ranks
re-run the same (``perf/torch/ddp_trials.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nndoctor.commands.perf.backend import PerfRun
from nndoctor.commands.perf.timeline import summarize
from nndoctor.commands.perf.torch.recorder import PERF_RECORDER, PerfRecorder
from nndoctor.commands.perf.torch.result import DeviceInfo, TorchPerfResult, device_info

if TYPE_CHECKING:
    from nndoctor.commands.perf.torch.ddp_trials import RankChannel
    from nndoctor.core.engine import Session
    from nndoctor.run.distributed.context import RankInfo
    from nndoctor.run.runner import Target


class TorchBackend:
    """``PerfBackend`` for PyTorch: its recorder is ``perf/torch/recorder.py``'s ``PerfRecorder``,
    stashed under ``PERF_RECORDER`` for ``perf/torch/instrument.py``."""

    def __init__(self, run: PerfRun, rank: RankInfo | None = None,
                 channel: RankChannel | str | None = None) -> None:
        self.run = run
        # Under torchrun: this rank, and the store channel the ranks' re-runs and reports go through
        # (perf/torch/ddp_trials.py), or why there is none (a str); None on one process.
        self.rank = rank
        self.channel = channel
        self.recorder: PerfRecorder | None = None
        self.trials: dict[str, Any] = {}

    def instrument(self, session: Session) -> None:
        recorder = self.recorder = PerfRecorder(session, self.run.config)
        session.stash[PERF_RECORDER] = recorder
        session.subscribe(recorder)
        recorder.on_window_end = lambda recorder: self._window_end(session, recorder)

    def step_counted(self, step: int) -> None:
        return None  # PyTorch steps arrive as step events, which the recorder hears itself

    def timed_steps(self) -> bool:
        recorder = self.recorder
        return recorder is not None and bool(recorder.records or recorder.facts.steps_seen)

    def measure(self, session: Session) -> TorchPerfResult:
        recorder = self.recorder
        if recorder is None:  # instrument() builds it before the script runs
            raise RuntimeError("the perf recorder was never built")
        breakdown = summarize(recorder.records)
        try:
            device = device_info(recorder.facts)
        except Exception as error:  # noqa: BLE001
            session.internal_error("perf device info", error)
            device = DeviceInfo()
        return TorchPerfResult(config=self.run.config, breakdown=breakdown, facts=recorder.facts, device=device,
                               trials=self.trials, steps_run=session.step)

    def _window_end(self, session: Session, recorder: PerfRecorder) -> None:
        run = self.run
        if not run.config.tries or run.backend() is not self:
            return  # another framework timed the steps: its trials run after the script
        from nndoctor.commands.perf.torch.run_trials import run_trials

        channel = self.channel
        if isinstance(channel, str):  # under torchrun without the store: no re-run could rendezvous
            self.trials.update({name: {"skipped": f"under torchrun every rank re-runs the script together, which "
                                                  f"needs torchrun's store; this rank could not reach it ({channel})"}
                                for name in run.config.tries})
            return
        # The trials call optimizer.step() and the loss functions: keep every hook quiet.
        active, session.active = session.active, False
        run.announce(f"measured {run.config.steps} steps; now trying "
                     f"{', '.join(run.config.tries)} on the captured step and loader")
        job = None
        try:
            target = run.target
            if target is None:
                raise RuntimeError("the perf run has no script to re-run")
            if channel is not None and self.rank is not None and not self.rank.is_leader:
                self._follow_trials(channel, target)  # rank 0 decides what is re-run; this rank re-runs it too
                return
            if channel is not None:
                from nndoctor.commands.perf.rerun import CHILD_TIMEOUT_S
                from nndoctor.commands.perf.torch.ddp_trials import JobRerun

                config = run.config
                started = config.started if config.started is not None else time.monotonic()
                job = JobRerun(channel, self._rank_child(target), CHILD_TIMEOUT_S,
                               time_left=lambda: config.budget - (time.monotonic() - started))
            # Filled in place: a trial interrupted by Ctrl-C / SIGTERM leaves the finished ones.
            run_trials(recorder, run.config, target, run.cwd, announce=run.announce, results=self.trials,
                       job=job)
        except Exception as error:  # noqa: BLE001 - observer rule
            session.internal_error("perf --try", error)
        finally:
            if job is not None:
                try:
                    job.done()  # the other ranks stop waiting for re-runs
                except Exception as error:  # noqa: BLE001
                    session.internal_error("perf --try (telling the other ranks the trials ended)", error)
            session.active = active

    def _rank_child(self, target: Target) -> Callable[..., dict[str, Any]]:
        """This rank's re-run of the script, as rank 0 commands it: the whole warm-up always runs (an
        early end on one rank would leave the others waiting in an all-reduce)."""
        from nndoctor.commands.perf import rerun

        cwd = self.run.cwd

        def run_child(changes: list[str], warmup: int, steps: int, min_steps: int | None,
                      env: dict[str, str], timeout_s: float | None = None) -> dict[str, Any]:
            return rerun.run_child(target, changes, warmup, steps, cwd, min_steps=min_steps, env=env,
                                   timeout_s=timeout_s)

        return run_child

    def _follow_trials(self, channel: RankChannel, target: Target) -> None:
        from nndoctor.commands.perf.rerun import CHILD_TIMEOUT_S
        from nndoctor.commands.perf.torch.ddp_trials import follow

        config = self.run.config
        started = config.started if config.started is not None else time.monotonic()
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # this rank's re-runs need the memory this process no longer uses
        follow(channel, self._rank_child(target), started + config.budget + CHILD_TIMEOUT_S + 60.0)

