"""A perf session: run the user's script for a warm-up plus a measured window, then measure changes.

``run_perf`` reuses ``nndoctor.run.runner.run_target``: the script runs unchanged and the engine
stops it cleanly after ``warmup + steps`` optimizer steps. Each framework's backend
(``perf/backend.py``: ``perf/torch/``, ``perf/tf/``) instruments the session before the script
runs; the one whose steps ran measures the window and its ``--try`` experiments, and gives the
``PerfResult`` the findings come from. Nothing here knows which framework that was.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from nndoctor.commands.perf.backend import PERF_RUN, PerfBackend, PerfResult, PerfRun
from nndoctor.commands.perf.config import PerfConfig
from nndoctor.core.engine import Session
from nndoctor.core.findings import Report
from nndoctor.core.registry import enabled_checks
from nndoctor.run.runner import Target, run_target

if TYPE_CHECKING:
    from nndoctor.commands.perf.torch.ddp_trials import RankChannel
    from nndoctor.run.distributed.context import RankInfo


class PerfSession(Session):
    """A Session whose subscribers are the backends' recorders and the run-scope P checks; the
    perf run's own state is ``self.stash[PERF_RUN]``."""

    def __init__(self, run: PerfRun, *, select: Iterable[str] = (), ignore: Iterable[str] = (),
                 command: list[str] | None = None) -> None:
        config = run.config
        # Every step of the window is a sampled step (CUDA events, sync locations).
        super().__init__(command=command, max_steps=config.last_step, checks=[],
                         full_window=config.last_step + 1)
        if not run.backends:
            run.backends = framework_backends(run)
        self.stash[PERF_RUN] = run
        # The recorders first: the P checks read what they recorded of the same event.
        for backend in run.backends:
            backend.instrument(self)
        for check in enabled_checks(select, ignore):
            if check.code.startswith("P"):
                self._add_check(check)

    def count_step(self, optimizer: Any) -> None:
        super().count_step(optimizer)
        for backend in self.stash[PERF_RUN].backends:
            backend.step_counted(self.step)


def framework_backends(run: PerfRun, rank: RankInfo | None = None,
                       channel: RankChannel | str | None = None) -> list[PerfBackend]:
    """One backend per framework, PyTorch first (it wins when both timed steps). ``rank`` and
    ``channel``: under torchrun (perf/torch/ddp_trials.py)."""
    from nndoctor.commands.perf.tf.backend import TfBackend
    from nndoctor.commands.perf.torch.backend import TorchBackend

    return [TorchBackend(run, rank=rank, channel=channel), TfBackend(run)]


def _silent(message: str) -> None:
    return None


def run_perf(target: Target, config: PerfConfig, *, select: Iterable[str] = (), ignore: Iterable[str] = (),
             announce: Callable[[str], None] | None = None, rank: RankInfo | None = None,
             channel: RankChannel | str | None = None) -> tuple[Report, PerfResult]:
    """Run ``target`` under a perf session; the report carries the run-scope P findings.

    ``announce`` receives a line for each thing being measured, as it starts. Under torchrun,
    ``rank`` (distributed/context.py's RankInfo) and ``channel`` (perf/torch/ddp_trials.py) make the
    trials re-runs of every rank, driven by rank 0."""
    if config.started is None:  # the budget counts from here: the script's own run included
        config = dataclasses.replace(config, started=time.monotonic())
    run = PerfRun(config, target=target, announce=announce or _silent)
    run.backends = framework_backends(run, rank=rank, channel=channel)
    session = PerfSession(run, select=select, ignore=ignore, command=target.command)
    run.announce(f"running {' '.join(target.command)}: {config.warmup} warm-up optimizer steps, "
                 f"then timing {config.steps}")
    report = run_target(target, session)
    return report, run.backend().measure(session)
