"""``nndoctor env``: inspect the installation, the driver and the GPUs; no training is run.

The facts are gathered here; the findings leave through the report tail every command shares
(``ReportDelivery``): ``--output-format``, ``--json``, ``--sarif``, ``--html``, suppressions
and ``--quiet`` behave as in ``nndoctor run``. The facts block is the text format's preamble.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO

from rich.console import Console

from nndoctor.catalog.table import code_enabled
from nndoctor.cli import add_common_options
from nndoctor.commands.env.checks import TensorflowTritonCrash, diagnose
from nndoctor.commands.env.collect import collect, shadowing_files, system_summary
from nndoctor.commands.env.render import facts_json, print_facts
from nndoctor.core.findings import Finding, Report
from nndoctor.core.selection import fail_threshold, filter_findings, selectors
from nndoctor.report.delivery import ReportDelivery
from nndoctor.util.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default=".", metavar="PATH",
                        help="folder your training script runs from, checked for files that shadow modules (default: .)")
    add_common_options(parser)


def _shadowing_findings(shadowing: list[dict[str, str]]) -> list[Finding]:
    """R102 (a runtime check's code, reported from the catalog table) for each shadowing file."""
    from nndoctor.catalog.table import rule
    from nndoctor.core.findings import Location

    shadow_check = rule("R102")
    return [shadow_check.finding(
        f"{item['path']} is named like the {item['shadows']} module '{item['name']}': a script started from this "
        f"folder imports this file instead.", location=Location(item["path"]),
        evidence=item, fix=f"rename {os.path.basename(item['path'])}") for item in shadowing]


def _progress_stream(args: argparse.Namespace) -> IO[str]:
    """Where the spinner may draw: stdout, unless stdout carries the JSON or the annotations."""
    machine_stdout = args.json == "-" or getattr(args, "output_format", "text") in ("json", "github")
    return sys.stderr if machine_stdout else sys.stdout


def run(args: argparse.Namespace) -> int:
    select, ignore = selectors(args)
    fail_on = fail_threshold(args)
    if not os.path.isdir(args.dir):
        raise UsageError(f"--dir {args.dir!r} is not a folder")
    output = ReportDelivery.from_args(args, text_stream="stdout")  # a bad --json path fails before any work
    # An ignored V109 spawns no `import tensorflow; import triton` child (it can take minutes).
    probe_tf_triton = code_enabled(TensorflowTritonCrash.code, select, ignore)
    progress = _progress_stream(args)
    if progress.isatty() and not getattr(args, "quiet", False):
        with Console(file=progress, highlight=False).status(
                "reading the driver and importing each framework in a child process…"):
            facts = collect(probe_tf_triton=probe_tf_triton)
    else:
        facts = collect(probe_tf_triton=probe_tf_triton)
    system = system_summary()
    shadowing = shadowing_files(os.path.abspath(args.dir))
    report = Report(command=["nndoctor", "env"], status="completed", steps=0)
    for finding in diagnose(facts) + _shadowing_findings(shadowing):
        report.add(finding)
    filter_findings(report, select, ignore)
    report.extra = {"environment": facts_json(facts, system, shadowing)}

    def render_text(stream: IO[str], json_path: str | None) -> None:
        from nndoctor.report.terminal import print_report

        print_facts(Console(file=stream, highlight=False), facts, system, shadowing)
        print_report(report, stream, json_path=json_path)

    try:
        output.deliver(report, render_text=render_text)
    finally:
        output.close()
    if output.json_failed:
        return 2  # the report the user asked for was not written
    return 1 if report.reaches(fail_on) else 0
