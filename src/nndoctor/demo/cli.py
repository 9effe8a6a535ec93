"""``nndoctor demo``: run the bundled, deliberately buggy training script under the doctor."""

from __future__ import annotations

import argparse
import os
import sys

from nndoctor.cli import add_common_options
from nndoctor.engine import Session
from nndoctor.report.delivery import ReportDelivery
from nndoctor.runner import Target, run_target
from nndoctor.runner_cli import exit_status
from nndoctor.selection import fail_threshold, selectors

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "buggy_train.py")


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
    output = ReportDelivery.from_args(args)
    print(f"nndoctor demo: training a small CNN on generated shapes ({SCRIPT})", file=sys.stderr)
    select, ignore = selectors(args)
    session = Session(select=select, ignore=ignore, command=["nndoctor-demo"])
    try:
        report = run_target(Target(SCRIPT, []), session, deliver=output.deliver)
        report.command = ["demo/buggy_train.py"]
        output.deliver(report)
    finally:
        output.close()
    return exit_status(report, fail_threshold(args))
