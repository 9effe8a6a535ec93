"""``nndoctor run [OPTIONS] SCRIPT [ARGS...]`` and ``nndoctor run [OPTIONS] -m MODULE [ARGS...]``.

Exit status: 0 clean; 1 a finding reached ``--fail-on``; 2 nndoctor could not start the
script (usage error, missing file, syntax error, unwritable ``--json`` path); 3 the script
crashed; 130 interrupted; killed by SIGTERM/SIGHUP (143/129 in a shell) after writing the report;
otherwise the script's own non-zero ``sys.exit`` / ``os._exit`` code.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from nndoctor.cli import add_common_options
from nndoctor.core.config import session_options
from nndoctor.core.engine import Session
from nndoctor.core.selection import fail_threshold, selectors
from nndoctor.report.delivery import ReportDelivery
from nndoctor.report.outputs import stdout_to_stderr
from nndoctor.run import watchdog
from nndoctor.run.runner import Target, check_target, run_target
from nndoctor.util.errors import UsageError

EXIT_FINDINGS = 1
EXIT_CRASHED = 3
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell shows for a job killed by SIGTERM
EXIT_HANGUP = 129  # 128 + SIGHUP


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = "nndoctor run [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]"
    add_common_options(parser)
    parser.add_argument("--max-steps", type=int, metavar="N",
                        help="stop the script cleanly after N optimizer steps and report")
    parser.add_argument("--preflight", action="store_true",
                        help="at the first optimizer step, run active tests on copies of the model, then train on")
    watchdog.add_options(parser)
    parser.add_argument("--merge-dir", metavar="DIR_OR_URL",
                        help="under torchrun on several nodes: a folder every node sees, or an fsspec "
                             "URL (s3://...), where the ranks leave their report parts for rank 0 "
                             "(default: torchrun's own rendezvous store)")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    parser.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS ...]")


def target_from_args(args: argparse.Namespace) -> Target:
    rest = list(args.target or [])
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.module:
        return Target(args.module, rest, is_module=True)
    if not rest:
        raise UsageError("nothing to run: give a script (nndoctor run train.py ...) or -m MODULE")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise UsageError("-m needs a module name")
        return Target(rest[1], rest[2:], is_module=True)
    return Target(rest[0], rest[1:])


def exit_status(report, threshold) -> int:
    if report.status == "interrupted":
        return EXIT_INTERRUPTED
    if report.status == "terminated":  # what a shell shows for the signal nndoctor died of
        return EXIT_TERMINATED if report.extra.get("signal", "SIGTERM") == "SIGTERM" else EXIT_HANGUP
    if report.status == "crashed":
        return EXIT_CRASHED
    if report.exit_code:
        return report.exit_code
    return EXIT_FINDINGS if report.reaches(threshold) else 0


def run(args: argparse.Namespace) -> int:
    from nndoctor.run.distributed import context as distributed

    target = target_from_args(args)
    distributed.refuse_launcher(target.name, target.is_module)
    # A missing or unparsable script is refused before the checks load (and import torch): a typo
    # fails at once instead of seconds later. run_target checks it again (for its other callers,
    # and for -m, whose module is found only once the working directory is on sys.path).
    if not target.is_module:
        check_target(target)
    rank = distributed.torchrun_rank()
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError("--max-steps must be at least 1")
    select, ignore = selectors(args)
    output = ReportDelivery.from_args(args, also_scan=[] if target.is_module else [target.name])
    session = Session(select=select, ignore=ignore, command=target.command, max_steps=args.max_steps,
                      **session_options(args))
    watchdog.configure(session, args)
    if getattr(args, "merge_dir", None):
        from nndoctor.run.distributed.transport import MERGE_DIR_ENV

        os.environ[MERGE_DIR_ENV] = args.merge_dir
    if args.html or args.tensorboard:
        from nndoctor.run.history import attach as record_history

        record_history(session)
    preflight = getattr(args, "preflight_stop", False) or args.preflight
    if preflight:
        from nndoctor.commands.preflight.probe import attach

        attach(session, stop=getattr(args, "preflight_stop", False))
    try:
        # Under torchrun rank 0 alone reports, after merging every rank's part.
        deliver: Any = output.deliver
        handoff = None
        if rank is not None:
            from nndoctor.run.distributed.rank_run import finish_rank, sigterm_handoff

            handoff = sigterm_handoff()

            # SIGTERM (torchrun stopping the ranks after one failed) and os._exit end the rank
            # the same way as the script's own end: its part, and the merge where this rank merges.
            def deliver_rank(report: Any) -> None:
                finish_rank(report, session, rank, args, deliver=output.deliver)

            deliver = deliver_rank

        with stdout_to_stderr(args.json == "-" or args.output_format == "json"):
            report = run_target(target, session, deliver=deliver, handoff=handoff)
        if rank is not None:
            return finish_rank(report, session, rank, args, deliver=output.deliver)
        preamble = []
        if preflight:
            from nndoctor.commands.preflight.render import preflight_lines

            preamble = preflight_lines(report)
        output.deliver(report, preamble=preamble)
    finally:
        output.close()
    return exit_status(report, fail_threshold(args))
