"""nndoctor's pytest plugin (registered through the ``pytest11`` entry point).

* the ``nndoctor`` fixture: the doctor watches the test (a ``watch()`` session)::

      def test_training_is_healthy(nndoctor):
          train(model, loader, steps=5)
          nndoctor.assert_clean()            # no finding at warning or above

* the ``nndoctor`` marker: the whole test runs under the doctor, and fails when a finding
  reaches ``fail_on`` (default ``warning``)::

      @pytest.mark.nndoctor(fail_on="error", ignore=["R101"])
      def test_train_step():
          ...

Both accept the CLI's ``select`` / ``ignore``; findings are shown in the failure message.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nndoctor.core.findings import Finding, Report, Severity
from nndoctor.integrations.base import DoctorOptions, DoctorRun, FindingsReachedFailOn, finding_line

MARKER_HELP = ("nndoctor(fail_on='warning', select=(), ignore=()): run the test under nndoctor and "
               "fail it when a finding reaches fail_on")


class DoctorSession:
    """What the ``nndoctor`` fixture gives a test: the running doctor and its assertions."""

    def __init__(self, run: DoctorRun) -> None:
        self._run = run

    @property
    def report(self) -> Report | None:
        """The report so far (complete after ``finish()``)."""
        return self._run.report

    def finish(self) -> Report:
        """Stop observing and let the checks conclude (end-of-run checks report here)."""
        report = self._run.finish("completed") if self._run.running else self._run.report
        assert report is not None
        return report

    def findings(self, at: str = "warning") -> list[Finding]:
        """Findings at severity ``at`` or above (finishes the session first)."""
        threshold = Severity.parse(at)
        return [f for f in self.finish().sorted_findings() if f.severity >= threshold]

    def assert_clean(self, at: str = "warning") -> None:
        """Fail the test when a finding reaches ``at`` (default: warning)."""
        found = self.findings(at)
        if found:
            lines = "\n".join(f"  {finding_line(f)}" for f in found)
            raise FindingsReachedFailOn(f"nndoctor: {len(found)} finding(s) at {at} or above:\n{lines}")


def _run_for(item: Any, *, select=(), ignore=(), fail_on: str | None = None) -> DoctorRun:
    options = DoctorOptions(select=select, ignore=ignore, fail_on=fail_on, quiet=True)
    return DoctorRun(options, ["pytest", item.nodeid])


@pytest.fixture
def nndoctor(request: pytest.FixtureRequest) -> Iterator[DoctorSession]:
    """The doctor watching this test; ``nndoctor.assert_clean()`` checks the findings."""
    marker = request.node.get_closest_marker("nndoctor")
    options = dict(marker.kwargs) if marker else {}
    options.pop("fail_on", None)  # the marker's threshold is checked by the marker
    run = _run_for(request.node, **options)
    run.start()
    try:
        yield DoctorSession(run)
    finally:
        if run.running:
            run.finish("completed")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    marker = item.get_closest_marker("nndoctor")
    if marker is None or "nndoctor" in getattr(item, "fixturenames", ()):
        return (yield)
    kwargs = dict(marker.kwargs)
    run = _run_for(item, select=kwargs.get("select", ()), ignore=kwargs.get("ignore", ()),
                   fail_on=kwargs.get("fail_on", "warning"))
    run.start()
    try:
        result = yield
    except BaseException as error:
        run.finish("crashed", error)
        raise
    run.finish("completed")
    item.stash[REPORT_KEY] = run.report
    report, threshold = run.report, run.threshold
    if report is not None and threshold is not None and report.reaches(threshold):
        found = [f for f in report.sorted_findings() if f.severity >= threshold]
        lines = "\n".join(f"  {finding_line(f)}" for f in found)
        raise FindingsReachedFailOn(
            f"nndoctor: {len(found)} finding(s) at {threshold.label} or above:\n{lines}")
    return result


REPORT_KEY = pytest.StashKey[Report | None]()
