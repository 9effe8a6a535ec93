"""The GitHub Actions reporter: one workflow command per finding, shown as an annotation.

``::error file=train.py,line=12,title=M101 eval-in-train-mode::message`` — see "Workflow
commands for GitHub Actions" (docs.github.com/en/actions/reference/workflow-commands-for-github-actions).
Actions reads these from the step's standard output. Values are escaped as the runner
expects (``%``, CR and LF in the message; also ``:`` and ``,`` in properties).
"""

from __future__ import annotations

from nndoctor.core.findings import Finding, Report, Severity
from nndoctor.report.paths import relative_path

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_line(finding: Finding) -> str:
    properties = []
    if finding.location is not None:
        properties.append(f"file={escape_property(relative_path(finding.location.path))}")
        if finding.location.line is not None:
            properties.append(f"line={finding.location.line}")
    properties.append(f"title={escape_property(f'{finding.code} {finding.name}')}")
    body = f"{finding.message}\nFix: {finding.fix}"
    return f"::{_COMMAND[finding.severity]} {','.join(properties)}::{escape_data(body)}"


def render_github(report: Report) -> str:
    lines = [github_line(f) for f in report.sorted_findings()]
    return "\n".join(lines) + ("\n" if lines else "")


def unused_suppression_line(path: str, line: int, text: str) -> str:
    """A notice for a ``# nndoctor: ignore`` comment that silenced nothing."""
    return (f"::notice file={escape_property(relative_path(path))},line={line},"
            f"title=unused suppression::{escape_data(text)}")
