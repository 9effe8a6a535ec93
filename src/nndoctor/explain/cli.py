"""``nndoctor explain [FILE|-]``: explain a traceback or a whole log saved from a run that was
not under nndoctor (same catalog as ``nndoctor run``, with less context: message and frames).

Reads FILE, or standard input for ``-`` (or when input is piped). Every traceback in the text
is explained; chained tracebacks ("During handling of the above exception …") count as one
crash. An error with no known cause is reported as such, with the traceback's last frame in
the user's code — never with a guessed cause.

Exit status:
  0  every error in the text was explained, or the text holds no error at all;
  1  some error has no known cause (``--fail-on never`` turns this into 0);
  2  usage error (unreadable FILE, nothing on standard input).
Explanations describe a crash that already happened, so their severity does not trip
``--fail-on`` the way a finding of ``nndoctor run`` does; ``--fail-on`` only decides whether
an unexplained error fails (any value but ``never``).
"""

from __future__ import annotations

import argparse
import sys

from rich.text import Text

from nndoctor.atomic import describe_write_error, prepare_output_path
from nndoctor.cli import add_common_options
from nndoctor.errors import UsageError
from nndoctor.explain.base import explain
from nndoctor.explain.crash import Crash
from nndoctor.explain.tracetext import parse_crashes
from nndoctor.findings import Finding, Report
from nndoctor.selection import fail_threshold, selectors

EXIT_UNEXPLAINED = 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = "nndoctor explain [OPTIONS] [FILE | -]"
    add_common_options(parser)
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help="a saved traceback or log ('-' or omitted with piped input: standard input)")
    parser.add_argument("--quiet", action="store_true", help="print no report on the terminal")


def read_text(name: str | None) -> tuple[str, str]:
    """(label, text) of the input."""
    if name in (None, "-"):
        if name is None and sys.stdin.isatty():
            raise UsageError("nothing to explain: give a FILE, or pipe a log into 'nndoctor explain -'")
        return "<stdin>", sys.stdin.read()
    try:
        with open(name, encoding="utf-8", errors="replace") as handle:
            return name, handle.read()
    except OSError as error:
        raise UsageError(f"can't read {name!r}: {error.strerror or error}") from None


def explain_text(text: str, *, select=(), ignore=()) -> tuple[list[Finding], list[Crash]]:
    """Explanations for every crash in ``text`` and the crashes with no known cause."""
    findings: list[Finding] = []
    unexplained: list[Crash] = []
    for chain in parse_crashes(text):
        finding = None
        # The last traceback of a chain is what was raised; earlier ones are its causes.
        for crash in reversed(chain):
            finding = explain(crash, select=select, ignore=ignore)
            if finding is not None:
                break
        if finding is not None:
            if all(f.merge_key != finding.merge_key for f in findings):
                findings.append(finding)
        else:
            unexplained.append(chain[-1])
    return findings, unexplained


def unexplained_summary(crash: Crash) -> dict[str, object]:
    frame = crash.user_frame
    return {
        "type": crash.exc_type,
        "message": crash.message.splitlines()[0] if crash.message else "",
        "location": str(crash.location) if crash.location else None,
        "source": frame.source if frame else "",
    }


def render_unexplained(console, crashes: list[Crash]) -> None:
    from nndoctor.report.unexplained import render_no_known_cause

    for crash in crashes:
        render_no_known_cause(console, unexplained_summary(crash))
        console.print()


def run(args: argparse.Namespace) -> int:
    select, ignore = selectors(args)
    json_path = prepare_output_path(args.json) if args.json else None  # fail before any work
    label, text = read_text(args.file)
    findings, unexplained = explain_text(text, select=select, ignore=ignore)
    report = Report(command=["explain", label])
    for finding in findings:
        report.add(finding)
    report.extra["tracebacks"] = len(findings) + len(unexplained)
    if unexplained:
        report.extra["unexplained"] = [unexplained_summary(c) for c in unexplained]
    if args.json:
        from nndoctor.report import write_json

        try:
            write_json(report, json_path)
        except OSError as error:
            print(describe_write_error(args.json, error), file=sys.stderr)
    if not args.quiet:
        show(report, unexplained, text_had_errors=bool(findings or unexplained))
    if unexplained and fail_threshold(args) is not None:
        return EXIT_UNEXPLAINED
    return 0


def show(report: Report, unexplained: list[Crash], *, text_had_errors: bool, file=None) -> None:
    from nndoctor.report.terminal import make_console, render_to

    console = make_console(file or sys.stdout)
    if not text_had_errors:
        console.print(Text("nndoctor explain: no Python traceback or error line found in the text.", style="bold"))
        return
    if report.findings:
        render_to(console, report)
        console.print()
    render_unexplained(console, unexplained)
