"""What the framework-neutral perf session needs of a framework: the ``PerfBackend`` protocol.

A perf run builds one backend per framework (``perf/torch/backend.py``, ``perf/tf/backend.py``);
each instruments the session before the script runs and hears every counted step. The script's
imports decide which of them times the steps: once the script ended, the first backend that
timed steps (PyTorch first) measures the window and gives the run's ``PerfResult``, which the
CLI turns into findings and JSON without knowing the framework.

The run's own state (``PerfRun``) lives in the session's stash under ``PERF_RUN``; each backend
keeps its per-run objects on itself and stashes itself under its own key, where the
instrumentation it installs finds it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from nndoctor.commands.perf.config import PerfConfig
from nndoctor.core.findings import Finding, Report
from nndoctor.core.stash import StashKey

if TYPE_CHECKING:
    from nndoctor.core.engine import Session
    from nndoctor.run.runner import Target


@dataclass
class Diagnosis:
    """The measured verdict of a window: findings, the step's class and the advice (unordered)."""

    findings: list[Finding]
    step_class: dict[str, Any]
    advice: list[dict[str, Any]]
    # Codes of the run-time estimates the measurement replaces (dropped from the run's report).
    replaces: frozenset[str] = frozenset()


class PerfResult(Protocol):
    """A measured window of one framework, with its ``--try`` results."""

    def to_json(self) -> dict[str, Any]:
        """The report's ``perf`` section (without ``step_class`` and ``advice``)."""
        ...

    def diagnose(self) -> Diagnosis: ...


class PerfBackend(Protocol):
    """One framework's perf machinery, for one run."""

    def instrument(self, session: Session) -> None:
        """Before the script runs: subscribe recorders, stash what the installers read."""
        ...

    def step_counted(self, step: int) -> None:
        """The session counted an optimizer step (for frameworks that send no step events)."""
        ...

    def timed_steps(self) -> bool:
        """Did this framework's steps run (the script imports and trains with it)?"""
        ...

    def measure(self, session: Session) -> PerfResult:
        """After the script: the window's result, the ``--try`` trials included."""
        ...


def _silent(message: str) -> None:
    return None


@dataclass
class PerfRun:
    """The state of one ``nndoctor perf`` run, kept in its session's stash (``PERF_RUN``): the
    configuration, what ``--try`` re-runs and from which folder (the script may chdir), and the
    frameworks' backends (built by the session when none are given)."""

    config: PerfConfig
    target: Target | None = None
    cwd: str = field(default_factory=os.getcwd)
    announce: Callable[[str], None] = _silent
    backends: list[PerfBackend] = field(default_factory=list)

    def backend(self) -> PerfBackend:
        """The backend that measures this run: the first that timed steps, else the first."""
        return next((backend for backend in self.backends if backend.timed_steps()), self.backends[0])


PERF_RUN = StashKey[PerfRun]("perf: the run's configuration and backends")


def replace_estimates(report: Report, diagnosis: Diagnosis) -> None:
    """Drop the run-time estimates the measured findings replace."""
    if diagnosis.replaces:
        report.findings = [f for f in report.findings if f.code not in diagnosis.replaces]
