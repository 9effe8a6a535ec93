"""Suppression comments and per-file-ignores: findings move to report.suppressed with a reason."""

from __future__ import annotations

import json

from nndoctor.core.findings import Finding, Location, Report, Severity
from nndoctor.core.suppression import apply_suppressions, directives_in_source
from nndoctor.report import render_text


def _finding(code: str, name: str, path: str, line: int) -> Finding:
    return Finding(code=code, name=name, severity=Severity.ERROR, message=f"{code} happened",
                   fix="fix it", location=Location(path, line))


def test_directives_are_read_from_comments_only():
    source = (
        "x = 1  # nndoctor: ignore[M101, O1]\n"
        "s = '# nndoctor: ignore'\n"
        "y = 2  # NNDOCTOR: ignore\n"
    )
    found = directives_in_source(source, "t.py")
    assert sorted(found) == [1, 3]
    assert found[1].codes == ("M101", "O1") and found[3].codes == ()


def test_comment_and_per_file_ignores_suppress_with_reasons(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "a = 1  # nndoctor: ignore[M101]\n"      # used
        "b = 2  # nndoctor: ignore[O101]\n"      # names another code: unused
        "c = 3  # nndoctor: ignore\n"            # every code
        "d = 4  # nndoctor: ignore[eval-in-train-mode]\n"  # unused
    )
    helper = tmp_path / "tests" / "helper.py"
    helper.parent.mkdir()
    helper.write_text("z = 0\n")
    report = Report()
    for finding in (_finding("M101", "eval-in-train-mode", str(script), 1),
                    _finding("L101", "softmax-before-cross-entropy", str(script), 2),
                    _finding("D101", "unnormalized-input", str(script), 3),
                    _finding("D101", "unnormalized-input", str(helper), 1)):
        report.add(finding)
    unused = apply_suppressions(report, per_file_ignores={"tests/*": ["D1"]}, root=tmp_path)
    assert [f.code for f in report.findings] == ["L101"]
    reasons = {(s.finding.code, s.finding.location.line): s.reason for s in report.suppressed}
    assert reasons[("M101", 1)] == f"comment at {script}:1"
    assert reasons[("D101", 3)] == f"comment at {script}:3"
    assert reasons[("D101", 1)] == "per-file-ignores 'tests/*' in pyproject.toml"
    assert sorted(d.line for d in unused) == [2, 4]
    data = json.loads(json.dumps(report.to_json("0")))
    assert len(data["suppressed"]) == 3 and all("reason" in s for s in data["suppressed"])
    assert "1 finding: 1 error · 3 suppressed" in render_text(report)


def test_suppressed_findings_do_not_fail_the_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("a = 1  # nndoctor: ignore[M1]\n")
    report = Report()
    report.add(_finding("M101", "eval-in-train-mode", str(script), 1))
    apply_suppressions(report)
    assert not report.reaches(Severity.INFO)
