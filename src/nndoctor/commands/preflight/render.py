"""The preflight table printed above the report: which tests ran, how long, and what they saw."""

from __future__ import annotations

from nndoctor.core.findings import Report


def preflight_lines(report: Report) -> list[str]:
    """Plain lines for the report's preamble (empty when preflight was not asked for)."""
    results = report.extra.get("preflight")
    if not results:
        return []
    if not results.get("ran"):
        return [f"preflight: did not run — {results.get('reason', '')}", ""]
    lines = [f"preflight on a copy of {results['model']} ({results['seconds']:.1f} s; "
             f"loss: {results.get('loss') or 'not rebuilt'})"]
    for test in results["tests"]:
        lines.append(f"  {test['status']:<12} {test['name']} ({test['seconds']:.2f} s): {test['detail']}")
    return [*lines, ""]
