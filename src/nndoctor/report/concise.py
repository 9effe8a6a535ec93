"""The concise reporter: one line per finding, ``path:line: CODE message`` (like ruff's)."""

from __future__ import annotations

from nndoctor.core.findings import Finding, Report


def _one_line(text: str) -> str:
    return " ".join(text.split())


def concise_line(finding: Finding) -> str:
    where = str(finding.location) if finding.location else "-"
    return f"{where}: {finding.code} [{finding.severity.label}] {_one_line(finding.message)}"


def render_concise(report: Report) -> str:
    lines = [concise_line(f) for f in report.sorted_findings()]
    return "\n".join(lines) + ("\n" if lines else "")
