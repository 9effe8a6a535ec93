"""``nndoctor run`` as one rank of ``torchrun``: write this rank's part; rank 0 merges and reports.

Exit status of a rank: the script's own (0, its ``sys.exit`` code, 1 when it raised as under
``python``, 130 when interrupted), never a finding, so torchrun does not take a finding for a
failed rank and kill the others. The verdict is decided once, by rank 0 after every rank
finished: with an explicit ``--fail-on LEVEL``, rank 0 exits 1 when the merged report reaches
LEVEL (torchrun then exits non-zero, which is what CI needs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any

from nndoctor.core.findings import Report
from nndoctor.core.selection import fail_threshold
from nndoctor.run.distributed.context import RankInfo, parts_dir
from nndoctor.run.distributed.gather import gather
from nndoctor.run.distributed.merge import merge_parts
from nndoctor.run.distributed.parts import rank_data, remove_parts, write_part
from nndoctor.run.distributed.stall_merge import STALL_MERGED, STALL_STOPPED, merged_here
from nndoctor.run.watchdog import EXIT_STALLED

# How long rank 0 waits for the other ranks' parts after its own run ended.
GATHER_TIMEOUT_S = float(os.environ.get("NNDOCTOR_GATHER_TIMEOUT", "120"))


# How long a rank that ended abnormally watches for rank 0's death before leaving the merge to it.
TAKEOVER_WAIT_S = float(os.environ.get("NNDOCTOR_TAKEOVER_WAIT", "3"))


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
        transport = send_part(info, report, session, folder, term.received)
        own = script_status(report)
        if session.stash.get(STALL_STOPPED, False):
            # Stopped by --stall-action stop; the merged stall report was delivered by rank 0's
            # watchdog (this rank's part stays for it when it was not: a late interruption).
            own = EXIT_STALLED
            if session.stash.get(STALL_MERGED, False) or (not info.is_leader and merged_here(folder)):
                return own
        if not (info.is_leader or take_over_merge(folder, info, report, term.received, transport)):
            if transport is not None:
                forget_sent_part(folder, info.rank)
            return own
        try:
            merged = gather_and_merge(folder, info, report, session, term.received, transport)
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


def send_part(info: RankInfo, report: Report, session: Any, folder: str,
              terminated: threading.Event) -> Any:
    """Across nodes (or to a named merge folder): send this rank's part, and the parts of the
    ranks of this node that died without Python. Returns the transport (None: node-local)."""
    from nndoctor.run.distributed.dead_ranks import dead_here, dead_rank_part
    from nndoctor.run.distributed.flight import registered_ranks
    from nndoctor.run.distributed.parts import build_part
    from nndoctor.run.distributed.transport import open_transport

    try:
        transport = open_transport(info)
        if transport is None:
            return None
        transport.put("part", info.rank, build_part(info.rank, info.world_size, report, rank_data(session)))
        if report.status != "completed" or terminated.is_set():
            for rank in registered_ranks(folder):
                alive = dead_here(folder, rank)
                if alive is not None:
                    transport.put("dead", rank, dead_rank_part(folder, rank, alive))
        return transport
    except Exception as error:  # noqa: BLE001 - observer rule: the part stays on this node
        print(f"nndoctor: rank {info.rank} could not send its report part to the merging rank "
              f"({type(error).__name__}: {error}); it stays in {folder}", file=sys.stderr)
        session.internal_error("sending this rank's report part", error)
        return None


def forget_sent_part(folder: str, rank: int) -> None:
    """The part went to the merging rank: this node keeps nothing of a rank that finished."""
    from nndoctor.run.distributed.flight import remove_records
    from nndoctor.run.distributed.parts import part_path

    with contextlib.suppress(OSError):
        part_path(folder, rank).unlink()
    remove_records(folder, [rank])
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def take_over_merge(folder: str, info: RankInfo, report: Report, terminated: threading.Event,
                    transport: Any = None) -> bool:
    """Should this rank merge because rank 0 died? Only a rank that ended abnormally looks (a
    rank that completed has no reason to think rank 0 did not), for a few seconds: rank 0's
    abort may land just after this rank's collective failed because of it."""
    from nndoctor.run.distributed.dead_ranks import dead_here
    from nndoctor.run.distributed.parts import part_path

    if report.status == "completed" and not terminated.is_set():
        return False
    deadline = time.monotonic() + TAKEOVER_WAIT_S
    while True:
        if part_path(folder, 0).exists():
            return False  # rank 0 finished with Python: it merges
        if dead_here(folder, 0) is not None:
            return transport.claim() if transport is not None else claim_merge(folder)
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


def gather_sent(transport: Any, folder: str, world_size: int, timeout_s: float,
                terminated: threading.Event, poll_s: float = 0.2) -> list[dict[str, Any]]:
    """``gather`` for parts sent across nodes: each rank's part, or the part a surviving rank of
    its node sent for it when it died, or (a rank of this node) what it left here."""
    from nndoctor.run.distributed.dead_ranks import dead_here, dead_rank_part

    found: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    terminated_deadline: float | None = None
    while True:
        for rank in range(world_size):
            if rank in found:
                continue
            part = transport.get("part", rank) or transport.get("dead", rank)
            if part is None and (alive := dead_here(folder, rank)) is not None:
                part = dead_rank_part(folder, rank, alive)
            if part is not None:
                found[rank] = part
        now = time.monotonic()
        if terminated.is_set() and terminated_deadline is None:
            terminated_deadline = now + 3.0
        if len(found) >= world_size or now >= deadline or (
                terminated_deadline is not None and now >= terminated_deadline):
            return [found[r] for r in sorted(found)]
        time.sleep(poll_s)


def gather_and_merge(folder: str, info: RankInfo, report: Report, session: Any,
                     terminated: threading.Event | None = None, transport: Any = None) -> Report:
    from nndoctor.run.distributed.flight import remove_records

    terminated = terminated if terminated is not None else threading.Event()
    # This rank ended abnormally: the others are likely blocked in a collective waiting for it,
    # and will not finish; do not hold the report back for long.
    timeout = GATHER_TIMEOUT_S if report.status == "completed" else min(GATHER_TIMEOUT_S, 5.0)
    if transport is not None:
        parts = gather_sent(transport, folder, info.world_size, timeout, terminated)
        for rank in range(info.world_size):
            for kind in ("part", "dead"):
                with contextlib.suppress(Exception):
                    transport.remove(kind, rank)
    else:
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
