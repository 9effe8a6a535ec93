"""The preflight table printed above the report: which tests ran, how long, and what they saw."""

from __future__ import annotations

from typing import IO

from rich.markup import escape

from nndoctor.findings import Report
from nndoctor.report.terminal import make_console

_STYLE = {"passed": "green", "failed": "bold red", "skipped": "dim", "inconclusive": "yellow"}


def print_preflight(report: Report, file: IO[str]) -> None:
    results = report.extra.get("preflight")
    if not results:
        return
    console = make_console(file)
    if not results.get("ran"):
        console.print(f"preflight: did not run — {escape(results.get('reason', ''))}")
        return
    console.print(f"[bold]preflight[/bold] on a copy of {escape(results['model'])} "
                  f"({results['seconds']:.1f} s; loss: {escape(results.get('loss') or 'not rebuilt')})")
    for test in results["tests"]:
        style = _STYLE.get(test["status"], "")
        console.print(f"  [{style}]{test['status']:<12}[/{style}] {escape(test['name'])} "
                      f"({test['seconds']:.2f} s): {escape(test['detail'])}")
    console.print("")
