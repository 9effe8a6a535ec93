"""The contract every check shares (one harness for all families, like torchmetrics' MetricTester).

- its documentation has the fixed headings and `nndoctor checks CODE` prints it;
- every runtime check has a buggy fixture (a real training script) where it fires at the
  line marked ``# expect: CODE``, with that check alone enabled;
- no runtime check reports an error or warning on any correct training program;
- no hook or patch is left behind after a run.
"""

from __future__ import annotations

import pytest

from nndoctor.findings import Severity
from nndoctor.registry import DOC_HEADINGS, all_checks
from tests.conftest import buggy_fixtures, correct_programs, expected_lines, run_script

ALL = all_checks()
RUNTIME = [c for c in ALL if c.scope == "run"]


@pytest.mark.parametrize("check", ALL, ids=lambda c: c.code)
def test_documentation_is_complete(check):
    sections = check.doc_sections()
    for heading in DOC_HEADINGS:
        assert sections.get(heading), f"{check.code}: missing or empty '## {heading}'"
    assert check.summary and check.fix and check.name == check.name.lower()
    assert " " not in check.name


@pytest.mark.parametrize("check", RUNTIME, ids=lambda c: c.code)
def test_buggy_fixture_fires_at_marked_line(check):
    fixtures = buggy_fixtures(check.code)
    assert fixtures, f"{check.code} has no buggy fixture in tests/fixtures/buggy marked '# expect: {check.code}'"
    for path in fixtures:
        report = run_script(path, select=[check.code])
        found = report.by_code(check.code)
        assert found, f"{check.code} did not fire on {path.name}: {report.internal_errors}"
        lines = {f.location.line for f in found if f.location}
        expected = expected_lines(path)[check.code]
        assert lines & expected, f"{check.code} on {path.name}: fired at {lines}, expected {expected}"
        assert all(f.location and f.location.path.endswith(path.name) for f in found)
        assert not report.internal_errors, report.internal_errors


@pytest.mark.parametrize("program", correct_programs(), ids=lambda p: p.stem)
def test_correct_program_has_no_error_or_warning(program):
    report = run_script(program)
    bad = [f for f in report.findings if f.severity >= Severity.WARNING]
    assert not bad, "\n".join(f"{f.code} {f.location}: {f.message}" for f in bad)
    assert report.status == "completed", report.traceback
    assert not report.internal_errors, report.internal_errors
    assert report.steps > 0


def test_catalog_codes_are_unique_and_names_kebab_case():
    codes = [c.code for c in ALL]
    assert len(codes) == len(set(codes))
    names = [c.name for c in ALL]
    assert len(names) == len(set(names))
