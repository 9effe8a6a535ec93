"""``nndoctor explain [FILE|-]``: explain a traceback or a whole log saved from a run that was
not under nndoctor (same catalog as ``nndoctor run``, with less context: message and frames).

Reads FILE, or standard input for ``-`` (or when input is piped). Every traceback in the text
is explained; chained tracebacks ("During handling of the above exception …") count as one
crash. Lines that name a cause without a Python exception (NCCL's watchdog, c10d's socket,
cuDNN's loader; ``logscan``) are read too, and a log with no error at all is searched for
warnings that name a catalogued cause. An error with no known cause is reported as such, with
the traceback's last frame in the user's code — never with a guessed cause.

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
import os
import re
import stat
import sys
from dataclasses import dataclass, field

from rich.text import Text

from nndoctor.cli import add_common_options
from nndoctor.commands.explain.base import explain, explanations
from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.launchers import is_launcher_report
from nndoctor.commands.explain.logscan import finding_from_line, scan
from nndoctor.commands.explain.pasted import clean
from nndoctor.commands.explain.tracetext import parse_clean
from nndoctor.core.findings import Finding, Report
from nndoctor.core.selection import fail_threshold, selectors
from nndoctor.report.delivery import ReportDelivery
from nndoctor.util.errors import UsageError
from nndoctor.util.sanitize import printable

EXIT_UNEXPLAINED = 1
EXIT_STATUS_HELP = """exit status:
  0  every error in the text was explained, or the text holds no error at all
  1  some error has no known cause (--fail-on never turns this into 0)
  2  usage error (unreadable FILE, nothing on standard input)"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = "nndoctor explain [OPTIONS] [FILE | -]"
    add_common_options(parser)
    # Explanations describe a crash that already happened: --fail-on only decides whether an
    # error with no known cause fails, and --help must say so (it is not run's threshold).
    parser._option_string_actions["--fail-on"].help = (
        "exit 1 when some error in the text has no known cause, unless 'never' "
        "(explained errors never fail: they describe a crash that already happened)")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXIT_STATUS_HELP
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help="a saved traceback or log ('-' or omitted with piped input: standard input)")


# Characters of input read: a log bigger than this is cut (with a note), so /dev/zero-like
# input or a runaway log cannot exhaust memory; 1 GiB leaves room for logs of hundreds of MB.
MAX_INPUT_CHARS = 1 << 30


def _read_bounded(handle, label: str) -> str:
    # In chunks: read(MAX_INPUT_CHARS) would reserve the whole maximum up front.
    chunks: list[str] = []
    left = MAX_INPUT_CHARS
    while left > 0:
        chunk = handle.read(min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    text = "".join(chunks)
    if left <= 0 and handle.read(1):
        print(f"nndoctor: note: {printable(label, keep_newlines=False)} is longer than "
              f"{MAX_INPUT_CHARS:,} characters: only the beginning was read", file=sys.stderr)
    return text


def read_text(name: str | None) -> tuple[str, str]:
    """(label, text) of the input: a regular file or a pipe (a FIFO, ``<(…)``, stdin)."""
    if name in (None, "-"):
        if name is None and sys.stdin.isatty():
            raise UsageError("nothing to explain: give a FILE, or pipe a log into 'nndoctor explain -'")
        return "<stdin>", _read_bounded(sys.stdin, "standard input")
    try:
        mode = os.stat(name).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise UsageError(f"{name}: not a regular file or pipe (a device or socket): not read")
        with open(name, encoding="utf-8", errors="replace") as handle:
            return name, _read_bounded(handle, name)
    except OSError as error:
        raise UsageError(f"can't read {name!r}: {error.strerror or error}") from None


# A log can hold thousands of tracebacks (every rank, every retry, every step of a loop that
# catches and prints). Identical ones are explained once; of the distinct ones, the first and
# the last MAX_CHAINS_ANALYSED / 2 are explained (the last is usually what ended the run) and
# the rest only counted, so the time stays linear in the size of the log.
MAX_CHAINS_ANALYSED = 200
# Links of one chain tried, from the raised exception backwards.
MAX_LINKS_TRIED = 8


@dataclass
class Explained:
    findings: list[Finding] = field(default_factory=list)
    unexplained: list[Crash] = field(default_factory=list)
    tracebacks: int = 0  # chains found in the text
    not_analysed: int = 0  # distinct chains beyond MAX_CHAINS_ANALYSED, counted only


def _signature(chain: list[Crash]) -> tuple:
    last = chain[-1]
    return (len(chain), last.text, tuple((f.path, f.line, f.function, f.source) for f in last.frames),
            tuple((f.path, f.line) for f in last.worker_frames))


def _selected(chains: list[list[Crash]]) -> tuple[list[list[Crash]], int]:
    """Distinct chains to analyse (first and last half of the budget) and how many are left out."""
    distinct: dict[tuple, list[Crash]] = {}
    for chain in chains:
        distinct.setdefault(_signature(chain), chain)
    unique = list(distinct.values())
    if len(unique) <= MAX_CHAINS_ANALYSED:
        return unique, 0
    half = MAX_CHAINS_ANALYSED // 2
    return unique[:half] + unique[-half:], len(unique) - 2 * half


def explain_all(text: str, *, select=(), ignore=()) -> Explained:
    """Explanations for the crashes in ``text``, those with no known cause, and the counts.

    Candidates are ranked: first the causes of the Python exceptions the log raised, then the
    causes named by log lines that are not Python exceptions (C++ loggers, launchers, loaders;
    ``logscan``), in the order they appear, and, only when the log holds no error at all, the
    causes its warnings name. Lines are consulted when some error is left unexplained or none
    was found: a log whose exceptions are all explained keeps exactly those explanations.
    A launcher's report that a child failed (``ChildFailedError``) is not a cause; it is left
    out once the cause of the failure is found elsewhere in the log.
    """
    cleaned = clean(text)
    chains = parse_clean(cleaned)
    chosen, not_analysed = _selected(chains)
    result = Explained(tracebacks=len(chains), not_analysed=not_analysed)
    keys: set = set()
    for chain in chosen:
        finding = None
        # The last traceback of a chain is what was raised; earlier ones are its causes.
        for crash in list(reversed(chain))[:MAX_LINKS_TRIED]:
            finding = explain(crash, select=select, ignore=ignore)
            if finding is not None:
                break
        if finding is None:
            result.unexplained.append(chain[-1])
        elif finding.merge_key not in keys:
            keys.add(finding.merge_key)
            result.findings.append(finding)
    if result.unexplained or not chains:
        _add_log_line_causes(result, cleaned, select=select, ignore=ignore, warnings=not chains)
    if result.findings:
        result.unexplained = [crash for crash in result.unexplained if not is_launcher_report(crash)]
    return result


def _add_log_line_causes(result: Explained, cleaned: str, *, select, ignore, warnings: bool) -> None:
    hits = scan(cleaned, explanations(select, ignore))
    errors = [hit for hit in hits if not hit.warning]
    chosen = errors or (hits if warnings else [])
    codes = {finding.code for finding in result.findings}
    for hit in chosen:
        if hit.explanation.code in codes:
            continue
        if hit.warning and any(re.search(wording, cleaned) for wording in hit.explanation.log_contradictions):
            continue  # the log shows the warning does not apply to this run
        codes.add(hit.explanation.code)
        result.findings.append(finding_from_line(hit))


def explain_text(text: str, *, select=(), ignore=()) -> tuple[list[Finding], list[Crash]]:
    """Explanations for the crashes in ``text`` and the crashes with no known cause."""
    result = explain_all(text, select=select, ignore=ignore)
    return result.findings, result.unexplained


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
    output = ReportDelivery.from_args(args, text_stream="stdout")  # a bad --json path fails before any work
    label, text = read_text(args.file)
    explained = explain_all(text, select=select, ignore=ignore)
    findings, unexplained = explained.findings, explained.unexplained
    report = Report(command=["explain", label])
    for finding in findings:
        report.add(finding)
    report.extra["tracebacks"] = explained.tracebacks
    if explained.not_analysed:
        report.extra["tracebacks_not_analysed"] = explained.not_analysed
        print(f"nndoctor: note: {explained.not_analysed:,} of {explained.tracebacks:,} tracebacks were "
              f"counted, not analysed (the first and last {MAX_CHAINS_ANALYSED // 2} distinct ones were)",
              file=sys.stderr)
    if unexplained:
        report.extra["unexplained"] = [unexplained_summary(c) for c in unexplained]
    try:
        output.deliver(report, render_text=lambda stream, _json: show(
            report, unexplained, text_had_errors=bool(findings or unexplained), file=stream))
    finally:
        output.close()
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
