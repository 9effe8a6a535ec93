"""One doctor run driven by a framework's hooks (Lightning, 🤗 Trainer, pytest) instead of
``nndoctor run``: start, hand out new findings as they appear, finish and deliver the reports.

The options mirror the CLI's (``select``, ``ignore``, ``fail_on``, ``json``, ``sarif``,
``html``, ``tensorboard``, ``output_format``, ``quiet``, ``report_unused_ignores``).
"""

from __future__ import annotations

import argparse
import atexit
import sys
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from nndoctor.core.findings import Finding, Report, Severity

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol


class FindingsReachedFailOn(AssertionError):
    """Raised at the end of a framework run when a finding reaches ``fail_on``."""


@dataclass
class DoctorOptions:
    select: Iterable[str] = ()
    ignore: Iterable[str] = ()
    fail_on: str | None = None  # error, warning, info; None or "never": never raise
    json: str | None = None
    sarif: str | None = None
    html: str | None = None
    tensorboard: str | None = None
    output_format: str = "text"
    quiet: bool = False
    report_unused_ignores: bool = False
    extra_args: dict[str, Any] = field(default_factory=dict)

    def namespace(self) -> argparse.Namespace:
        """The options as the CLI's parsed arguments (what the shared reporters read)."""
        return argparse.Namespace(
            json=self.json, sarif=self.sarif, html=self.html, tensorboard=self.tensorboard,
            output_format=self.output_format, quiet=self.quiet,
            report_unused_ignores=self.report_unused_ignores, config_file=None, **self.extra_args)

    def threshold(self) -> Severity | None:
        if self.fail_on in (None, "never"):
            return None
        return Severity.parse(self.fail_on)


class DoctorRun:
    """A Session installed between ``start()`` and ``finish()``."""

    def __init__(self, options: DoctorOptions, command: list[str]) -> None:
        from nndoctor.core.registry import parse_codes, unknown_selectors

        self.options = options
        self.command = command
        self.select = parse_codes(list(options.select))
        self.ignore = parse_codes(list(options.ignore))
        unknown = unknown_selectors(self.select + self.ignore)
        if unknown:
            raise ValueError(f"unknown check code or name: {', '.join(unknown)} (see 'nndoctor checks')")
        self.threshold = options.threshold()  # a bad fail_on fails now, not after training
        self.session: Any = None
        self.installation: InstallationProtocol | None = None
        self._announced = 0

    @property
    def running(self) -> bool:
        return self.installation is not None

    @property
    def report(self) -> Report | None:
        return self.session.report if self.session is not None else None

    def start(self) -> None:
        from nndoctor.core.engine import Session
        from nndoctor.instrument.extensions import install

        if self.running:
            return
        # No command while installing: like watch(), the process may have been seeded before
        # the doctor started (R101 then reads torch.initial_seed()).
        self.session = Session(select=self.select, ignore=self.ignore)
        if self.options.html or self.options.tensorboard:
            from nndoctor.run.history import attach

            attach(self.session)
        self._announced = 0
        self.installation = install(self.session)
        self.session.report.command = list(self.command)

    def new_findings(self) -> list[Finding]:
        """Findings that appeared since the last call (for logging as training goes)."""
        if self.session is None:
            return []
        findings = self.session.report.findings
        fresh, self._announced = findings[self._announced:], len(findings)
        return list(fresh)

    def finish(self, status: str = "completed", crash: BaseException | None = None,
               stream: Any = None) -> Report | None:
        """Uninstall, let the checks conclude, write the requested reports and print one."""
        installation, self.installation = self.installation, None
        if installation is None:  # not running
            return self.report
        from nndoctor.report.outputs import deliver
        from nndoctor.run.end import finish

        finish(self.session, installation, status, crash)
        deliver(self.session.report, self.options.namespace(), stream or sys.stderr)
        return self.session.report

    def check_fail_on(self) -> None:
        report, threshold = self.report, self.threshold
        if report is not None and threshold is not None and report.reaches(threshold):
            worst = [f for f in report.sorted_findings() if f.severity >= threshold]
            lines = "; ".join(f"{f.code} {f.name} at {f.location}" for f in worst[:5])
            raise FindingsReachedFailOn(
                f"nndoctor: {len(worst)} finding(s) at {threshold.label} or above: {lines}")


class DoctorCallbackBase:
    """What the framework callbacks share (Lightning's and 🤗 Trainer's ``DoctorCallback``,
    mixed in before the framework's callback class): the options of the CLI, one
    ``DoctorRun`` labelled ``command``, and the ``report`` it leaves."""

    command: ClassVar[tuple[str, ...]] = ()
    # The framework tells the callback of no exception: a run still open at interpreter exit
    # (``train()`` raised) is finished as crashed and its reports written then.
    close_at_exit: ClassVar[bool] = False

    def __init__(
        self,
        *,
        select: Iterable[str] = (),
        ignore: Iterable[str] = (),
        fail_on: str | None = None,
        json: str | None = None,
        sarif: str | None = None,
        html: str | None = None,
        tensorboard: str | None = None,
        output_format: str = "text",
        quiet: bool = False,
    ) -> None:
        super().__init__()
        options = DoctorOptions(select=select, ignore=ignore, fail_on=fail_on, json=json, sarif=sarif,
                                html=html, tensorboard=tensorboard, output_format=output_format, quiet=quiet)
        self._run = DoctorRun(options, list(self.command))
        self.report: Report | None = None
        if self.close_at_exit:
            reference = weakref.ref(self)  # atexit must not keep every callback alive

            def close_if_alive() -> None:
                callback = reference()
                if callback is not None:
                    callback._close_abandoned()

            atexit.register(close_if_alive)

    def _close_abandoned(self) -> None:
        if self._run.running:  # the run raised and no hook told us
            self.report = self._run.finish("crashed")


def finding_line(finding: Finding) -> str:
    """One line for a framework's logger."""
    where = f" at {finding.location}" if finding.location else ""
    return f"nndoctor {finding.severity.label} {finding.code} {finding.name}{where}: {finding.message} Fix: {finding.fix}"
