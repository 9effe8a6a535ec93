"""``nndoctor env``: inspect the installation, the driver and the GPUs; no training is run."""

from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console

from nndoctor.atomic import describe_write_error, prepare_output_path
from nndoctor.cli import add_common_options
from nndoctor.env.checks import ENV_CHECKS, diagnose
from nndoctor.env.collect import collect, shadowing_files, system_summary
from nndoctor.env.render import facts_json, print_facts
from nndoctor.errors import UsageError
from nndoctor.findings import Finding, Report
from nndoctor.registry import is_enabled, parse_codes
from nndoctor.report import print_report, write_json
from nndoctor.selection import fail_threshold


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default=".", metavar="PATH",
                        help="folder your training script runs from, checked for files that shadow modules (default: .)")
    add_common_options(parser)


def _selectors(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """``--select``/``--ignore`` over the V checks (and R102) without importing any framework."""
    select, ignore = parse_codes(args.select or []), parse_codes(args.ignore or [])
    known = [*ENV_CHECKS]
    bad = [s for s in select + ignore
           if s.upper() != "ALL" and s.upper() != "R102" and s.lower() != "module-shadowing"
           and not any(c.code.startswith(s.upper()) or c.name == s.lower() for c in known)]
    if bad:
        raise UsageError(f"unknown check code or name for env: {', '.join(bad)} (see 'nndoctor checks --scope env')")
    return select, ignore


def _shadowing_findings(shadowing: list[dict[str, str]]) -> list[Finding]:
    """R102 (a runtime check's code, reported from the catalog table) for each shadowing file."""
    from nndoctor.catalog_table import rule
    from nndoctor.findings import Location

    shadow_check = rule("R102")
    return [shadow_check.finding(
        f"{item['path']} is named like the {item['shadows']} module '{item['name']}': a script started from this "
        f"folder imports this file instead.", location=Location(item["path"]),
        evidence=item, fix=f"rename {os.path.basename(item['path'])}") for item in shadowing]


def run(args: argparse.Namespace) -> int:
    select, ignore = _selectors(args)
    fail_on = fail_threshold(args)
    if not os.path.isdir(args.dir):
        raise UsageError(f"--dir {args.dir!r} is not a folder")
    json_path = prepare_output_path(args.json) if args.json else None  # fail before any work
    to_stdout = args.json == "-"
    out = sys.stderr if to_stdout else sys.stdout
    console = Console(file=out, highlight=False)
    if out.isatty():
        with console.status("reading the driver and importing each framework in a child process…"):
            facts = collect()
    else:
        facts = collect()
    system = system_summary()
    shadowing = shadowing_files(os.path.abspath(args.dir))
    findings = diagnose(facts) + _shadowing_findings(shadowing)
    report = Report(command=["nndoctor", "env"], status="completed", steps=0)
    by_code = {c.code: c for c in ENV_CHECKS}
    for finding in findings:
        cls = by_code.get(finding.code)
        if cls is None or is_enabled(cls, select, ignore):
            if finding.code == "R102" and any(s.upper() == "R102" or s.lower() == "module-shadowing" for s in ignore):
                continue
            report.add(finding)
    report.extra = {"environment": facts_json(facts, system, shadowing)}
    print_facts(console, facts, system, shadowing)
    print_report(report, file=out, json_path=None if to_stdout else args.json)
    if json_path:
        try:
            write_json(report, json_path)
        except OSError as error:
            print(describe_write_error(args.json, error), file=sys.stderr)
            return 2
    return 1 if report.reaches(fail_on) else 0
