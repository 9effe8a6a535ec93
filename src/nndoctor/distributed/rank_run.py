"""``nndoctor run`` as one rank of ``torchrun``: write this rank's part; rank 0 merges and reports.

Exit status of a rank: the script's own (0, its ``sys.exit`` code, 1 when it raised as under
``python``, 130 when interrupted), never a finding, so torchrun does not take a finding for a
failed rank and kill the others. The verdict is decided once, by rank 0 after every rank
finished: with an explicit ``--fail-on LEVEL``, rank 0 exits 1 when the merged report reaches
LEVEL (torchrun then exits non-zero, which is what CI needs).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from nndoctor.distributed.context import RankInfo, parts_dir_for
from nndoctor.distributed.merge import merge_parts
from nndoctor.distributed.parts import rank_data, remove_parts, wait_for_parts, write_part
from nndoctor.findings import Report
from nndoctor.selection import fail_threshold

# How long rank 0 waits for the other ranks' parts after its own run ended.
GATHER_TIMEOUT_S = float(os.environ.get("NNDOCTOR_GATHER_TIMEOUT", "120"))


class _Terminated(Exception):
    """SIGTERM while rank 0 waits: torchrun is stopping the ranks; report what is there."""


def parts_dir(info: RankInfo) -> str:
    # Every rank of one node is a child of the same torchrun agent process.
    return parts_dir_for(info.run_id, os.getppid())


def script_status(report: Report) -> int:
    """The exit status the script would have had under plain ``python``."""
    if report.status == "interrupted":
        return 130
    if report.status == "crashed":
        return 1
    return int(report.exit_code or 0)


def fail_on_given(args: argparse.Namespace, argv: list[str] | None = None) -> bool:
    """Was ``--fail-on`` given on nndoctor's command line (not among the script's arguments)?"""
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args = list(getattr(args, "target", None) or [])
    ours = argv[: len(argv) - len(script_args)] if script_args else argv
    return any(token == "--fail-on" or token.startswith("--fail-on=") for token in ours)


def finish_rank(report: Report, session: Any, info: RankInfo, args: argparse.Namespace,
                deliver: Any = None) -> int:
    """Close this rank's run; on rank 0 gather, merge, write and print the one report."""
    folder = parts_dir(info)
    try:
        write_part(folder, info.rank, info.world_size, report, rank_data(session))
    except OSError as error:
        print(f"nndoctor: rank {info.rank} could not write its report part to {folder}: {error}",
              file=sys.stderr)
    own = script_status(report)
    if not info.is_leader:
        return own
    try:
        merged = gather_and_merge(folder, info, report, session)
    except Exception as error:  # noqa: BLE001 - observer rule: fall back to this rank's report
        session.internal_error("merging the ranks' reports", error)
        merged = report
    if deliver is not None:
        deliver(merged)
    else:
        emit_report(merged, args)
    threshold = fail_threshold(args)
    if own == 0 and fail_on_given(args) and merged.reaches(threshold):
        return 1
    return own


def gather_and_merge(folder: str, info: RankInfo, report: Report, session: Any) -> Report:
    terminated = False
    previous = None
    if threading.current_thread() is threading.main_thread():
        def on_term(signum, frame):
            raise _Terminated
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        # Rank 0 crashed: the others are likely blocked in a collective waiting for it, and
        # will not finish; do not hold the crash report back for long.
        timeout = min(GATHER_TIMEOUT_S, 5.0) if report.status == "crashed" else GATHER_TIMEOUT_S
        parts = wait_for_parts(folder, info.world_size, timeout)
    except _Terminated:
        from nndoctor.distributed.parts import read_parts

        parts, terminated = read_parts(folder), True
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    merged = merge_parts(parts, command=report.command, world_size=info.world_size,
                         select=list(session.select), ignore=list(session.ignore))
    if terminated and merged.status == "completed":
        merged.status = "interrupted"
    if len({p.get("rank") for p in parts}) >= info.world_size:
        remove_parts(folder)
    return merged


def emit_report(report: Report, args: argparse.Namespace) -> None:
    from nndoctor.report import print_report, write_json

    if args.json:
        try:
            write_json(report, args.json)
        except OSError as error:
            print(f"nndoctor: could not write {args.json}: {error}", file=sys.stderr)
    if not args.quiet:
        sys.stdout.flush()
        print_report(report, sys.stderr, json_path=args.json if args.json not in (None, "-") else None)
