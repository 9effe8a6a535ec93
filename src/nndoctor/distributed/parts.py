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

from nndoctor._version import __version__
from nndoctor.atomic import atomic_write_text
from nndoctor.findings import Report

_PART_GLOB = "rank-*.json"


def rank_data(session: Any) -> dict[str, Any]:
    """Plain numbers this rank records for the cross-rank checks (kept on the session)."""
    return session.__dict__.setdefault("_distributed_rank_data", {})


def part_path(folder: str, rank: int, pid: int | None = None) -> Path:
    suffix = f"-{pid}" if pid is not None else ""
    return Path(folder) / f"rank-{rank}{suffix}.json"


def write_part(folder: str, rank: int, world_size: int | None, report: Report, data: dict[str, Any],
               *, unique: bool = False) -> Path:
    """Write this rank's part atomically (``unique``: add the pid, for children that may share a rank)."""
    path = part_path(folder, rank, os.getpid() if unique else None)
    part = {
        "rank": rank,
        "world_size": world_size,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "report": report.to_json(__version__),
        "data": data,
    }
    atomic_write_text(path, json.dumps(part, ensure_ascii=False))
    return path


def read_parts(folder: str) -> list[dict[str, Any]]:
    """Every complete part in ``folder``, by rank (a part that cannot be parsed is skipped)."""
    parts = []
    for path in sorted(Path(folder).glob(_PART_GLOB)):
        try:
            parts.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return sorted(parts, key=lambda p: (p.get("rank", 0), p.get("pid", 0)))


def wait_for_parts(folder: str, count: int, timeout_s: float, poll_s: float = 0.05) -> list[dict[str, Any]]:
    """Wait until ``count`` parts exist (or ``timeout_s`` passed) and return those present."""
    deadline = time.monotonic() + timeout_s
    while True:
        present = len(list(Path(folder).glob(_PART_GLOB)))
        if present >= count or time.monotonic() >= deadline:
            return read_parts(folder)
        time.sleep(poll_s)


def remove_parts(folder: str) -> None:
    """Delete the parts and their folder (best effort: another process may still read them)."""
    for path in Path(folder).glob(_PART_GLOB):
        try:
            path.unlink()
        except OSError:
            pass
    try:
        os.rmdir(folder)
    except OSError:
        pass
