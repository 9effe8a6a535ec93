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
import time
from typing import Any

from nndoctor.distributed.context import RankInfo, parts_dir_for
from nndoctor.distributed.merge import merge_parts
from nndoctor.distributed.parts import rank_data, remove_parts, write_part
from nndoctor.findings import Report
from nndoctor.selection import fail_threshold

# How long rank 0 waits for the other ranks' parts after its own run ended.
GATHER_TIMEOUT_S = float(os.environ.get("NNDOCTOR_GATHER_TIMEOUT", "120"))


# How long a rank that ended abnormally watches for rank 0's death before leaving the merge to it.
TAKEOVER_WAIT_S = float(os.environ.get("NNDOCTOR_TAKEOVER_WAIT", "3"))


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


# torchrun's SIGTERM (sent to every rank once one failed) after the script ended: noted instead
# of killing the rank half-way through its part or the merge; waits then end early. torchrun's
# stop grace (30 s) is longer than any wait below.
_SIGTERM_RECEIVED = threading.Event()


def _note_sigterm(signum: int, frame: Any) -> None:
    _SIGTERM_RECEIVED.set()


def sigterm_handoff() -> dict[int, Any]:
    """For the run's signal guard: from the script's end on, SIGTERM is only noted."""
    return {signal.SIGTERM: _note_sigterm}


class _SigtermNoted:
    """While a rank finishes (main thread only), SIGTERM is noted in ``received``."""

    def __init__(self) -> None:
        self.received = _SIGTERM_RECEIVED
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> _SigtermNoted:
        if threading.current_thread() is threading.main_thread():
            try:
                self._previous = signal.signal(signal.SIGTERM, _note_sigterm)
                self._installed = True
            except (ValueError, OSError):
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            previous = signal.SIG_DFL if self._previous is _note_sigterm else self._previous
            signal.signal(signal.SIGTERM, previous)
            # The rank then exits with its script's status: torchrun is stopping it anyway.
            self.received.clear()


def finish_rank(report: Report, session: Any, info: RankInfo, args: argparse.Namespace,
                deliver: Any = None) -> int:
    """Close this rank's run; the merging rank gathers, merges, writes and prints the one report.

    The merging rank is rank 0, or, when rank 0 died without Python (SIGABRT, SIGKILL, a
    segfault) on this node, the first surviving rank that claims its place.
    """
    folder = parts_dir(info)
    with _SigtermNoted() as term:
        try:
            write_part(folder, info.rank, info.world_size, report, rank_data(session))
        except OSError as error:
            print(f"nndoctor: rank {info.rank} could not write its report part to {folder}: {error}",
                  file=sys.stderr)
        own = script_status(report)
        if not (info.is_leader or take_over_merge(folder, info, report, term.received)):
            return own
        try:
            merged = gather_and_merge(folder, info, report, session, term.received)
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


def take_over_merge(folder: str, info: RankInfo, report: Report, terminated: threading.Event) -> bool:
    """Should this rank merge because rank 0 died? Only a rank that ended abnormally looks (a
    rank that completed has no reason to think rank 0 did not), for a few seconds: rank 0's
    abort may land just after this rank's collective failed because of it."""
    from nndoctor.distributed.dead_ranks import dead_here
    from nndoctor.distributed.parts import part_path

    if report.status == "completed" and not terminated.is_set():
        return False
    deadline = time.monotonic() + TAKEOVER_WAIT_S
    while True:
        if part_path(folder, 0).exists():
            return False  # rank 0 finished with Python: it merges
        if dead_here(folder, 0) is not None:
            return claim_merge(folder)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def claim_merge(folder: str) -> bool:
    """The first surviving rank to claim the merge gets it (an exclusive file creation)."""
    try:
        os.close(os.open(os.path.join(folder, "merge.claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:
        return False
    return True


def gather(folder: str, world_size: int, timeout_s: float, terminated: threading.Event,
           poll_s: float = 0.1) -> list[dict[str, Any]]:
    """The parts of every rank, waiting until each rank wrote one or died on this node, or until
    ``timeout_s`` (3 s once SIGTERM came: the other ranks are being stopped too). A rank that
    died without a part is represented by what it left (``dead_ranks.dead_rank_part``)."""
    from nndoctor.distributed.dead_ranks import dead_here, dead_rank_part
    from nndoctor.distributed.parts import read_parts

    deadline = time.monotonic() + timeout_s
    terminated_deadline: float | None = None
    while True:
        parts = read_parts(folder)
        present = {p.get("rank") for p in parts}
        missing = [r for r in range(world_size) if r not in present]
        dead = {r: alive for r in missing if (alive := dead_here(folder, r)) is not None}
        now = time.monotonic()
        if terminated.is_set() and terminated_deadline is None:
            terminated_deadline = now + 3.0
        if len(dead) == len(missing) or now >= deadline or (
                terminated_deadline is not None and now >= terminated_deadline):
            # A part may have landed between the listing and the liveness check.
            parts = read_parts(folder)
            present = {p.get("rank") for p in parts}
            return parts + [dead_rank_part(folder, r, alive) for r, alive in dead.items() if r not in present]
        time.sleep(poll_s)


def gather_and_merge(folder: str, info: RankInfo, report: Report, session: Any,
                     terminated: threading.Event | None = None) -> Report:
    from nndoctor.distributed.flight import remove_records

    terminated = terminated if terminated is not None else threading.Event()
    # This rank ended abnormally: the others are likely blocked in a collective waiting for it,
    # and will not finish; do not hold the report back for long.
    timeout = GATHER_TIMEOUT_S if report.status == "completed" else min(GATHER_TIMEOUT_S, 5.0)
    parts = gather(folder, info.world_size, timeout, terminated)
    merged = merge_parts(parts, command=report.command, world_size=info.world_size,
                         select=list(session.select), ignore=list(session.ignore))
    if terminated.is_set() and merged.status == "completed":
        merged.status = "interrupted"
    if len({p.get("rank") for p in parts}) >= info.world_size:
        remove_records(folder, range(info.world_size))
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
