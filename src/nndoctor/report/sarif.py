"""The SARIF 2.1.0 reporter, for code-scanning UIs (GitHub code scanning, VS Code SARIF viewer).

One run; ``tool.driver.rules`` holds every check a result refers to, with its summary and
its full documentation from the catalog as help text; each result has the check's level,
the message and fix, and a physical location (file relative to the repository root and the
line). Suppressed findings are results with a ``suppressions`` entry and its justification,
as the standard (§3.27.23) provides. Spec: docs.oasis-open.org/sarif/sarif/v2.1.0/.
"""

from __future__ import annotations

import json
import os
from typing import Any

from nndoctor.core._version import __version__
from nndoctor.core.findings import Finding, Report, Severity, _jsonable
from nndoctor.report.paths import relative_path, report_root
from nndoctor.util.atomic import atomic_write_text

SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _rule(finding: Finding) -> dict[str, Any]:
    from nndoctor.catalog.table import find_rule

    cls = find_rule(finding.code)
    rule: dict[str, Any] = {"id": finding.code, "name": finding.name}
    if cls is not None:
        doc = cls.documentation()
        rule["shortDescription"] = {"text": cls.summary}
        rule["fullDescription"] = {"text": cls.summary}
        help_markdown = f"{doc}\n\n## Fix\n{cls.fix}" if doc else cls.fix
        rule["help"] = {"text": help_markdown, "markdown": help_markdown}
        rule["defaultConfiguration"] = {"level": _LEVEL[cls.severity]}
        rule["properties"] = {"tags": [f"nndoctor-{cls.scope}"], "heuristic": bool(cls.heuristic),
                              **({"falsePositives": cls.false_positives} if cls.false_positives else {})}
    return rule


def _fix(edit: Any) -> dict[str, Any]:
    """A SARIF 2.1.0 ``fix`` (§3.55) from an ``nndoctor fix`` edit: replacements of the
    original file's characters."""
    return {
        "description": {"text": f"{edit.title}{'' if edit.safe else ' (unsafe fix)'}"},
        "artifactChanges": [{
            "artifactLocation": {"uri": relative_path(edit.display_path or edit.path), "uriBaseId": "%SRCROOT%"},
            "replacements": [{"deletedRegion": {"charOffset": h.char_offset, "charLength": h.char_length},
                              "insertedContent": {"text": "".join(h.new_lines)}} for h in edit.hunks],
        }],
    }


def _fixes_by_finding(report: Report) -> dict[int, list[dict[str, Any]]]:
    """id(finding) -> the fixes proposed for it (edits rolled back by --verify are left out)."""
    fixes: dict[int, list[dict[str, Any]]] = {}
    for edit in report.edits or ():
        if edit.hunks and edit.status != "rolled-back" and edit.cell_range is None:
            for finding in edit.findings:
                fixes.setdefault(id(finding), []).append(_fix(edit))
    return fixes


def _result(finding: Finding, rule_index: int, suppression: str | None,
            fixes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": finding.code,
        "ruleIndex": rule_index,
        "level": _LEVEL[finding.severity],
        "message": {"text": f"{finding.message}\nFix: {finding.fix}"},
        "properties": {
            "name": finding.name,
            "count": finding.count,
            "evidence": _jsonable(finding.evidence),
        },
    }
    if finding.first_step is not None:
        result["properties"]["first_step"] = finding.first_step
    if finding.location is not None and finding.location.path:
        physical: dict[str, Any] = {
            "artifactLocation": {"uri": relative_path(finding.location.path), "uriBaseId": "%SRCROOT%"}
        }
        if finding.location.line is not None and finding.location.line >= 1:
            physical["region"] = {"startLine": finding.location.line}
        result["locations"] = [{"physicalLocation": physical}]
    if fixes:
        result["fixes"] = fixes
    if suppression is not None:
        kind = "inSource" if suppression.startswith("comment") else "external"
        result["suppressions"] = [{"kind": kind, "justification": suppression}]
    return result


def sarif_log(report: Report) -> dict[str, Any]:
    entries: list[tuple[Finding, str | None]] = [(f, None) for f in report.sorted_findings()]
    entries += [(s.finding, s.reason) for s in report.suppressed]
    rules: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    results = []
    fixes = _fixes_by_finding(report)
    for finding, suppression in entries:
        if finding.code not in index:
            index[finding.code] = len(rules)
            rules.append(_rule(finding))
        results.append(_result(finding, index[finding.code], suppression, fixes.get(id(finding))))
    root_uri = report_root().as_uri().rstrip("/") + "/"
    invocation: dict[str, Any] = {
        "executionSuccessful": report.status in ("completed", "stopped") and not report.exit_code,
        "commandLine": " ".join(report.command),
        "properties": {"status": report.status, "steps": report.steps},
    }
    if report.internal_errors:
        invocation["toolExecutionNotifications"] = [
            {"level": "warning", "message": {"text": f"internal error in {e.where}: {e.error}"}}
            for e in report.internal_errors
        ]
    return {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "nndoctor",
                "version": __version__,
                "semanticVersion": __version__,
                "rules": rules,
            }},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": root_uri}},
            "invocations": [invocation],
            "results": results,
        }],
    }


def write_sarif(report: Report, path: str | os.PathLike[str]) -> None:
    atomic_write_text(path, json.dumps(sarif_log(report), indent=2, ensure_ascii=False) + "\n")
