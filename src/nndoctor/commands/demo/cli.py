"""``nndoctor demo``: run the bundled, deliberately buggy training script under the doctor."""

from __future__ import annotations

import argparse
import os
import sys

from nndoctor.cli import add_common_options
from nndoctor.core.engine import Session
from nndoctor.core.findings import Location, Report
from nndoctor.core.selection import fail_threshold, selectors
from nndoctor.report.delivery import ReportDelivery
from nndoctor.report.outputs import stdout_to_stderr
from nndoctor.run.cli import exit_status
from nndoctor.run.runner import Target, run_target

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "buggy_train.py")
SHOWN_PATH = "nndoctor/commands/demo/buggy_train.py"


def configure(parser: argparse.ArgumentParser) -> None:
    add_common_options(parser)
    # A demo that finds its bugs has succeeded: by default it never fails on findings.
    parser.set_defaults(fail_on="never")
    parser.add_argument("--show-source", action="store_true", help="print the demo script and exit")


def run(args: argparse.Namespace) -> int:
    if args.show_source:
        with open(SCRIPT, encoding="utf-8") as handle:
            sys.stdout.write(handle.read())
        return 0
    from nndoctor.instrument.extensions import torch_available
    from nndoctor.util.errors import UsageError

    if not torch_available():
        raise UsageError("the demo trains a PyTorch model and PyTorch is not installed: "
                         "pip install 'nndoctor[torch]'")
    output = ReportDelivery.from_args(args)
    print(f"nndoctor demo: training a small CNN on generated shapes ({SHOWN_PATH}; "
          "--show-source prints it)", file=sys.stderr)
    select, ignore = selectors(args)
    session = Session(select=select, ignore=ignore, command=["nndoctor-demo"])
    if args.html or args.tensorboard:
        from nndoctor.run.history import attach

        attach(session)
    try:
        with stdout_to_stderr(args.json == "-" or args.output_format == "json"):
            report = run_target(Target(SCRIPT, []), session, deliver=output.deliver)
        report.command = [SHOWN_PATH]
        show_bundled_paths(report)
        output.deliver(report)
    finally:
        output.close()
    return exit_status(report, fail_threshold(args))


def show_bundled_paths(report: Report) -> None:
    """Findings in the bundled script name it as users know it (nndoctor/commands/demo/buggy_train.py),
    not by where pip put it on this machine."""
    for finding in report.findings:
        location = finding.location
        if location is not None and os.path.abspath(location.path) == SCRIPT:
            finding.location = Location(SHOWN_PATH, location.line)
