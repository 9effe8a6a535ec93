"""The report as the terminal may show it: every string from the run escaped.

Module and class names, file names, evidence values, exception messages and tracebacks come
from the user's code and data. Printed raw, an ESC/CSI/OSC sequence in them can recolour, hide
or rewrite what the terminal shows (CWE-150, https://cwe.mitre.org/data/definitions/150.html).
The terminal reporter renders this escaped copy (``sanitize.printable``); the JSON
report keeps the raw values. Escaping the copy once, rather than at each print, also covers
whatever a renderer prints from the report later (``report.extra`` included). Rich markup is
not a concern as long as renderers print ``Text`` objects, which never parse markup.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any

from nndoctor.core.findings import Finding, Report
from nndoctor.util.sanitize import printable


def terminal_view(report: Report) -> Report:
    """A copy of ``report`` whose text is safe to print; with ``NNDOCTOR_DEBUG=1`` its traceback
    is the full one, nndoctor's own frames included."""
    view = copy.copy(report)
    view.command = [printable(part, keep_newlines=False) for part in report.command]
    view.findings = [_finding(f) for f in report.findings]
    view.internal_errors = [
        dataclasses.replace(e, where=printable(e.where, keep_newlines=False), error=printable(e.error),
                            traceback=printable(e.traceback))
        for e in report.internal_errors
    ]
    view.extra = _escaped(report.extra)
    traceback = report.traceback
    if os.environ.get("NNDOCTOR_DEBUG") and report.extra.get("traceback_full"):
        traceback = report.extra["traceback_full"]
    view.traceback = printable(traceback) if traceback else traceback
    return view


def _finding(finding: Finding) -> Finding:
    location = finding.location
    if location is not None:
        location = dataclasses.replace(location, path=printable(location.path, keep_newlines=False))
    return dataclasses.replace(
        finding,
        name=printable(finding.name, keep_newlines=False),
        message=printable(finding.message),
        fix=printable(finding.fix),
        location=location,
        evidence=_escaped(finding.evidence, keep_newlines=False),
    )


def _escaped(value: Any, keep_newlines: bool = True) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return printable(value, keep_newlines=keep_newlines)
    if isinstance(value, dict):
        return {_escaped(k, False): _escaped(v, keep_newlines) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_escaped(v, keep_newlines) for v in value]
    return printable(str(value), keep_newlines=keep_newlines)
