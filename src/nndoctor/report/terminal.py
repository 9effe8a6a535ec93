"""The terminal reporter: a short, ranked list of findings rendered with rich."""

from __future__ import annotations

import io
import os
import sys
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from nndoctor.core.findings import Finding, Report, Severity
from nndoctor.report.capping import cap_items, cap_lists
from nndoctor.report.unexplained import render_no_known_cause

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold yellow", Severity.INFO: "bold blue"}
_EVIDENCE_SHOWN = 6


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(cap_items([_format_value(v) for v in value], 6)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_format_value(v)}" for k, v in list(value.items())[:6]) + "}"
    return str(value)


def _headline(report: Report) -> Text:
    command = " ".join(report.command) if report.command else "nndoctor"
    status = report.status
    if report.steps:
        status += f" after {report.steps} optimizer step{'s' if report.steps != 1 else ''}"
    text = Text()
    text.append("nndoctor", style="bold")
    text.append(f" · {command} · {status}")
    return text


def _finding_block(console: Console, finding: Finding) -> None:
    head = Text()
    head.append(f"{finding.severity.label:<7} ", style=_STYLE[finding.severity])
    head.append(f"{finding.code} ", style="bold")
    head.append(finding.name)
    if finding.location:
        head.append(f"  {finding.location}", style="cyan")
    extras = []
    if finding.count > 1:
        extras.append(f"×{finding.count}")
    if finding.first_step is not None:
        extras.append(f"first at step {finding.first_step}")
    if finding.ranks is not None:
        extras.append(f"rank{'s' if len(finding.ranks) != 1 else ''} {', '.join(map(str, finding.ranks))}")
    if extras:
        head.append(f"  ({', '.join(extras)})", style="dim")
    console.print(head, soft_wrap=True)  # a path:line must stay on one line to be clickable
    # Messages, evidence and fixes are already escaped (terminal_view): control characters
    # from the user's run are shown, never sent to the terminal.
    _indented(console, Text(cap_lists(finding.message)))
    shown = [(k, v) for k, v in finding.evidence.items() if not str(k).startswith("_")]
    if shown:
        parts = [f"{k}={_format_value(v)}" for k, v in shown[:_EVIDENCE_SHOWN]]
        if len(shown) > _EVIDENCE_SHOWN:
            parts.append(f"… (+{len(shown) - _EVIDENCE_SHOWN} in JSON)")
        _indented(console, Text("evidence: " + "; ".join(parts), style="dim"))
    _indented(console, Text("fix: " + finding.fix, style="green"))


def _indented(console: Console, text: Text) -> None:
    """Print with a hanging indent: wrapped lines stay under the first, words are not split."""
    width = max(20, console.width - 4)
    for line in text.wrap(console, width, overflow="fold"):  # fold only words wider than a line
        line.rstrip()
        console.print(Text("    ") + line, soft_wrap=True)


def render_to(console: Console, report: Report, *, json_path: str | None = None) -> None:
    from nndoctor.report.terminal_view import printable, terminal_view

    report = terminal_view(report)  # user text escaped: no control characters reach the terminal
    json_path = printable(json_path, keep_newlines=False) if json_path else json_path
    console.print(_headline(report), soft_wrap=True)
    findings = report.sorted_findings()
    if report.traceback and report.status == "crashed":
        console.print(Text("\nThe script raised:", style="bold"))
        console.print(Text(cap_lists(report.traceback.rstrip()), style="dim"))
    console.print()
    # A rank that died (X113) or ranks in different collectives (X110) explain a distributed crash.
    if report.status == "crashed" and not any(f.code.startswith("E") or f.code in ("X110", "X113")
                                              for f in findings):
        render_no_known_cause(console, report.extra.get("crash") or {})
        console.print()
    not_observed = report.extra.get("not_observed")  # a launcher ran the training elsewhere
    if not_observed and report.status != "crashed":
        console.print(Text(not_observed, style="bold yellow"))
        console.print()
    elif not findings and report.status != "crashed":
        console.print(Text("No problems found.", style="bold green"))
    for finding in findings:
        _finding_block(console, finding)
        console.print()
    counts = {s: sum(1 for f in findings if f.severity == s) for s in Severity}
    summary = ", ".join(
        f"{n} {s.label}{'s' if n != 1 else ''}" for s, n in sorted(counts.items(), reverse=True) if n
    )
    tail = f"{len(findings)} finding{'s' if len(findings) != 1 else ''}"
    if summary:
        tail += f": {summary}"
    if report.suppressed:
        tail += f" · {len(report.suppressed)} suppressed"
    if report.internal_errors:
        tail += f" · {len(report.internal_errors)} internal error(s) in nndoctor (see JSON)"
        for err in report.internal_errors[:3]:
            console.print(Text(f"internal error in {err.where}: {_first_sentence(err.error)}", style="magenta"))
    if json_path:
        tail += f" · JSON: {json_path}"
    sampling = report.extra.get("sampling")
    if sampling and sampling.get("changes"):
        console.print(Text(sampling_note(sampling), style="dim"))
    console.print(Text(tail, style="bold"))
    console.print(Text("Details: nndoctor checks CODE", style="dim"))


def sampling_note(sampling: dict) -> str:
    """One line saying that the checks' full instrumentation ran less often than configured,
    and why (the sampling budget)."""
    costs = sampling.get("sampled_step_cost_ms") or [0.0]
    changes = sampling["changes"]
    widest = max(change["sample_every"] for change in changes)
    final = sampling["sample_every"]
    return (f"Sampled steps were spread out from step {changes[0]['step']:,} (1 in "
            f"{sampling['configured']:,} configured, 1 in {widest:,} at most"
            + (f", 1 in {final:,} at the end" if final != widest else "")
            + f"): a sampled step cost ≈ {min(costs[-2:]):.1f} ms more than an ordinary one, and "
            f"sampled steps may take {sampling['budget']:.0%} of the run (NNDOCTOR_SAMPLE_BUDGET; "
            "an interval set by sample-every or NNDOCTOR_SAMPLE_EVERY is kept).")


def _first_sentence(text: str, limit: int = 160) -> str:
    """The head of an internal error for the terminal (the JSON keeps it whole): a CUDA
    out-of-memory message alone is ten lines of allocator advice meant for the user's code."""
    head = text.strip().splitlines()[0] if text.strip() else text
    cut = head.find(". ")
    if 0 < cut < limit:
        head = head[: cut + 1]
    return head if len(head) <= limit else head[: limit - 1] + "…"


def make_console(file: IO[str] | None = None, width: int | None = None) -> Console:
    file = file or sys.stderr
    if width is None and not (hasattr(file, "isatty") and file.isatty()):
        width = 100  # logs and pipes: no terminal to fit, keep lines readable
    return Console(file=file, width=width, highlight=False, soft_wrap=False, **no_color_options())


def no_color_options() -> dict[str, Any]:
    """Console options for NO_COLOR (no-color.org): no escape codes at all. rich's own
    no_color keeps bold and dim; a console without a colour system writes plain text."""
    if os.environ.get("NO_COLOR"):
        return {"no_color": True, "color_system": None}
    return {}


def print_report(report: Report, file: IO[str] | None = None, *, json_path: str | None = None) -> None:
    render_to(make_console(file), report, json_path=json_path)


def render_findings_text(findings: list[Finding], width: int = 100) -> str:
    """Plain text of the finding blocks alone, as the terminal report prints them, at a fixed
    width (snapshot tests: the words a user reads, without the run's headline and tail)."""
    from nndoctor.report.terminal_view import terminal_view

    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False, no_color=True)
    for finding in terminal_view(Report(findings=list(findings))).sorted_findings():
        _finding_block(console, finding)
        console.print()
    return buffer.getvalue()


def render_text(report: Report, width: int = 100, *, json_path: str | None = None) -> str:
    """Plain text of the terminal report at a fixed width (for tests and logs)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False, no_color=True)
    render_to(console, report, json_path=json_path)
    return buffer.getvalue()


__all__ = ["escape", "make_console", "no_color_options", "print_report", "render_findings_text", "render_text", "render_to"]
