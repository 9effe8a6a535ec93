"""One merged report when the stall watchdog stops a ``torchrun`` job whose ranks all hang.

Ranks blocked in a mismatched collective (NCCL, or gloo waiting on a peer) never reach the end
of the script, and ``--stall-action stop`` may have to end them with ``os._exit`` (a wait in
native code cannot be interrupted): the usual merge at the script's end never happens. So each
rank's watchdog leaves its snapshot (findings, stall record, flight record), rank 0's watchdog
gathers the snapshots with a bounded wait, merges them into one report (X110 compares the
ranks' positions), delivers it and leaves a marker; the other ranks wait for that marker before
stopping, because torchrun stops every rank as soon as one exits.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from nndoctor.core.findings import Report
from nndoctor.core.stash import StashKey

# Set on a rank whose watchdog stopped the run: it exits like ``timeout(1)`` (124).
STALL_STOPPED = StashKey[bool]("the stall watchdog stopped this rank")
# Set on the merging rank once it delivered the merged stall report: the script's end (when
# the interruption reaches Python) must not merge and print a second one.
STALL_MERGED = StashKey[bool]("the merged stall report was delivered")
_MARKER = "stall-merged"


def gather_window(stall_seconds: float) -> float:
    """How long the merging rank waits for the other ranks' snapshots: their watchdogs fire
    at about the same time when they hang together, a little later under load."""
    return min(30.0, max(5.0, stall_seconds))


def marker_path(folder: str) -> Path:
    return Path(folder) / _MARKER


def merge_stalled(session: Any, info: Any, folder: str, snapshot: Report, stall_seconds: float) -> Report:
    """rank 0: the ranks' snapshots (or what a dead rank left), merged into one stalled report."""
    from nndoctor.run.distributed.gather import gather
    from nndoctor.run.distributed.merge import merge_parts

    parts = gather(folder, info.world_size, gather_window(stall_seconds), threading.Event())
    merged = merge_parts(parts, command=list(snapshot.command), world_size=info.world_size,
                         select=list(session.select), ignore=list(session.ignore))
    merged.status = "stalled"
    if merged.distributed is not None:
        merged.distributed["stalled_ranks"] = [(p.get("data") or {}).get("stall") for p in parts]
    return merged


def mark_merged(folder: str) -> None:
    """Tell the other ranks that the merged report is out: they may stop now."""
    with contextlib.suppress(OSError):
        marker_path(folder).touch()


def wait_for_merge(folder: str, timeout_s: float, poll_s: float = 0.1) -> bool:
    """A rank other than rank 0: wait (bounded) until rank 0 delivered the merged report."""
    deadline = time.monotonic() + timeout_s
    while not marker_path(folder).exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def merged_here(folder: str) -> bool:
    return marker_path(folder).exists()


def remove_marker(folder: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(marker_path(folder))
