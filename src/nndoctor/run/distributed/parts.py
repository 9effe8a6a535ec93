"""Per-rank report parts: each rank writes one JSON file; the merging process reads them.

Files, not collectives: a part is written when the rank's run ends however it ends (crash,
``sys.exit``, ``--max-steps``), and reading parts needs no process group, so a rank that
crashed, or a group that was never initialised, still contributes its findings.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from nndoctor.core._version import __version__
from nndoctor.core.findings import Report
from nndoctor.core.stash import StashKey
from nndoctor.util.atomic import atomic_write_text

_PART_GLOB = "rank-*.json"
# Written by the stall watchdog while the rank is still running (or about to be stopped).
_STALL_GLOB = "stall-rank-*.json"


# Plain numbers this rank records for the cross-rank checks (rank, world size, per-check facts).
RANK_DATA = StashKey[dict[str, Any]]("this rank's data for the cross-rank checks")
# In an instrumented child process (``mp.spawn``, ``mp.Process``): the parent's parts folder and
# the child's index, for the stall watchdog's snapshot.
CHILD_PART = StashKey[tuple[str, int]]("child process report part")


def rank_data(session: Any) -> dict[str, Any]:
    """Plain numbers this rank records for the cross-rank checks (kept in the session's stash)."""
    return session.stash.get_or_create(RANK_DATA, dict)


def child_part(session: Any) -> tuple[str, int] | None:
    """``(parts folder, index)`` when this session runs an instrumented child process."""
    return session.stash.get(CHILD_PART, None)


def part_path(folder: str, rank: int, pid: int | None = None) -> Path:
    suffix = f"-{pid}" if pid is not None else ""
    return Path(folder) / f"rank-{rank}{suffix}.json"


def write_part(folder: str, rank: int, world_size: int | None, report: Report, data: dict[str, Any],
               *, unique: bool = False, stall: bool = False) -> Path:
    """Write this rank's part atomically (``unique``: add the pid, for children that may share a
    rank; ``stall``: a snapshot taken by the stall watchdog, superseded by the final part)."""
    path = part_path(folder, rank, os.getpid() if unique else None)
    if stall:
        path = path.with_name("stall-" + path.name)
    atomic_write_text(path, json.dumps(build_part(rank, world_size, report, data), ensure_ascii=False))
    return path


def build_part(rank: int, world_size: int | None, report: Report, data: dict[str, Any]) -> dict[str, Any]:
    """This rank's part: its report and the plain numbers the cross-rank checks compare."""
    return {
        "rank": rank,
        "world_size": world_size,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "report": report.to_json(__version__),
        "data": data,
    }


def _load(paths: list[Path]) -> list[dict[str, Any]]:
    loaded = []
    for path in paths:
        try:
            loaded.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):  # a part being replaced, or not ours
            continue
    return loaded


def read_parts(folder: str, *, with_stalls: bool = True) -> list[dict[str, Any]]:
    """Every complete part in ``folder``, by rank (a part that cannot be parsed is skipped).

    A process that stalled and never finished left only its watchdog snapshot: that stands in
    for its final part (``with_stalls``).
    """
    parts = _load(sorted(Path(folder).glob(_PART_GLOB)))
    if with_stalls:
        final = {(p.get("rank"), p.get("pid")) for p in parts}
        parts += [p for p in _load(sorted(Path(folder).glob(_STALL_GLOB)))
                  if (p.get("rank"), p.get("pid")) not in final]
    return sorted(parts, key=lambda p: (p.get("rank", 0), p.get("pid", 0)))


def read_stalls(folder: str) -> list[dict[str, Any]]:
    """The watchdog snapshots of the ranks that stalled."""
    return _load(sorted(Path(folder).glob(_STALL_GLOB)))


def wait_for_parts(folder: str, count: int, timeout_s: float, poll_s: float = 0.05) -> list[dict[str, Any]]:
    """Wait until ``count`` parts exist (or ``timeout_s`` passed) and return those present."""
    deadline = time.monotonic() + timeout_s
    while True:
        present = len(list(Path(folder).glob(_PART_GLOB)))
        if present >= count or time.monotonic() >= deadline:
            return read_parts(folder)
        time.sleep(poll_s)


def wait_for_stalls(folder: str, count: int, timeout_s: float, poll_s: float = 0.1) -> list[dict[str, Any]]:
    """Wait until ``count`` stall snapshots exist (or ``timeout_s`` passed)."""
    deadline = time.monotonic() + timeout_s
    while len(list(Path(folder).glob(_STALL_GLOB))) < count and time.monotonic() < deadline:
        time.sleep(poll_s)
    return read_stalls(folder)


def remove_parts(folder: str) -> None:
    """Delete the parts and their folder (best effort: another process may still read them)."""
    # With the ranks' flight records (nndoctor.run.distributed.flight) and the merge claim.
    records = [path for glob in ("alive-rank-*.json", "flight-rank-*.bin", "fatal-rank-*.txt")
               for path in Path(folder).glob(glob)]
    for path in [*Path(folder).glob(_PART_GLOB), *Path(folder).glob(_STALL_GLOB), *records,
                 Path(folder) / "merge.claim", Path(folder) / "stall-merged"]:
        try:
            path.unlink()
        except OSError:
            pass
    try:
        os.rmdir(folder)
    except OSError:
        pass
