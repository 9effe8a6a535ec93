"""Delivering a finished report: suppressions, then every requested output, then the terminal.

Every subcommand ends with ``deliver(report, args, stream)``: the same Report feeds the
terminal text, ``--output-format concise|github|json``, ``--json``, ``--sarif``, ``--html``
and ``--tensorboard`` (rich's lesson: one renderer per output, one source of data).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from nndoctor.core.findings import Report
from nndoctor.core.suppression import Directive, apply_suppressions


def suppress(report: Report, args: argparse.Namespace, also_scan: Iterable[str] = ()) -> list[Directive]:
    """Apply comments and per-file-ignores; record unused comments when asked to."""
    config = getattr(args, "config_file", None)
    unused = apply_suppressions(
        report,
        per_file_ignores=config.per_file_ignores if config else None,
        root=config.root if config else None,
        config_name=str(config.path) if config and config.path else "pyproject.toml",
        also_scan=also_scan,
    )
    if getattr(args, "report_unused_ignores", False):
        report.extra["unused_suppressions"] = [d.to_json() for d in unused]
        return unused
    return []


def _write(what: str, path: str | None, writer: Callable[[Report, str], Any], report: Report) -> None:
    if not path:
        return
    try:
        writer(report, path)
    except Exception as error:  # noqa: BLE001 - a report we could not write must not hide the others
        reason = getattr(error, "strerror", None) or error
        print(f"nndoctor: could not write the {what} report {path}: {reason}", file=sys.stderr)


def _write_html(report: Report, path: str) -> None:
    from nndoctor.report.html import write_html

    write_html(report, path)


def _write_tensorboard(report: Report, path: str) -> None:
    from nndoctor.report.tensorboard import write_tensorboard

    write_tensorboard(report, path)


def write_files(report: Report, args: argparse.Namespace, *, include_json: bool = True) -> None:
    from nndoctor.report.json_report import write_json
    from nndoctor.report.sarif import write_sarif

    json_path = getattr(args, "json", None)
    if include_json and json_path and json_path != "-":
        _write("JSON", json_path, write_json, report)
    _write("SARIF", getattr(args, "sarif", None), write_sarif, report)
    _write("HTML", getattr(args, "html", None), _write_html, report)
    _write("TensorBoard", getattr(args, "tensorboard", None), _write_tensorboard, report)


def deliver(
    report: Report,
    args: argparse.Namespace,
    stream: IO[str] | None = None,
    *,
    also_scan: Iterable[str] = (),
    render_text: Callable[[IO[str], str | None], None] | None = None,
    stdout: IO[str] | None = None,
    json_writer: Callable[[Report], bool] | None = None,
    preamble: Iterable[str] = (),
) -> None:
    """Suppress, write every requested file, and print the report in the chosen format.

    ``stream`` is where the human report goes (stderr for commands that run a script);
    JSON for ``--json -`` / ``--output-format json`` and GitHub commands go to ``stdout``.
    ``render_text(stream, json_path)`` replaces the standard text report for subcommands
    that show more (perf's breakdown, explain's unexplained errors); ``preamble`` lines are
    printed above the text report. ``json_writer(report) -> written`` replaces the plain
    ``--json`` write (``ReportDelivery``: a path fixed before the script ran, special files).
    """
    from nndoctor.util.sanitize import printable

    stream = stream or sys.stdout
    stdout = stdout or sys.stdout
    unused = suppress(report, args, also_scan)
    write_files(report, args, include_json=json_writer is None)
    output_format = getattr(args, "output_format", None) or "text"
    json_path = getattr(args, "json", None)
    json_written = json_writer(report) if json_writer is not None and json_path else bool(json_path)
    if (json_path == "-" and json_writer is None) or (output_format == "json" and json_path != "-"):
        from nndoctor.report.json_report import render_json

        stdout.write(render_json(report))
        stdout.flush()
    if output_format == "github":
        from nndoctor.report.github import github_line, unused_suppression_line

        stdout.flush()
        for finding in report.sorted_findings():
            print(github_line(finding), file=stdout)
        for directive in unused:
            print(unused_suppression_line(directive.path, directive.line, str(directive)), file=stdout)
        stdout.flush()
        return
    if getattr(args, "quiet", False) or output_format == "json":
        return
    if json_path == "-" and stream is stdout:
        stream = sys.stderr  # stdout carries the JSON alone
    if output_format == "concise":
        from nndoctor.report.concise import render_concise

        stream.write(render_concise(report))
        for directive in unused:
            stream.write(f"{directive}\n")
        stream.flush()
        return
    preamble = list(preamble)
    if preamble:
        stream.write(printable("\n".join(preamble)) + "\n")
    shown_json = json_path if json_path not in (None, "-") and json_written else None
    if render_text is not None:
        render_text(stream, shown_json)
    else:
        from nndoctor.report.terminal import print_report

        print_report(report, stream, json_path=shown_json)
    for directive in unused:
        print(f"info    {directive}", file=stream)
    stream.flush()


@contextlib.contextmanager
def stdout_to_stderr(active: bool) -> Iterator[None]:
    """While the script runs, send its standard output (Python's and the file descriptor's,
    so DataLoader workers and C extensions too) to stderr: stdout carries our JSON alone."""
    if not active:
        yield
        return
    sys.stdout.flush()
    try:
        saved_fd: int | None = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no usable descriptor 1: redirect Python's stdout only
        saved_fd = None
    saved_stdout = sys.stdout
    try:
        sys.stdout = sys.stderr
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        sys.stdout = saved_stdout
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)
