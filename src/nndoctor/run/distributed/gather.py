"""Waiting for the ranks' report parts of one node: each rank's part, or what a rank that died
without Python left behind (used by the end-of-run merge and by the stall watchdog's merge)."""

from __future__ import annotations

import threading
import time
from typing import Any


def gather(folder: str, world_size: int, timeout_s: float, terminated: threading.Event,
           poll_s: float = 0.1) -> list[dict[str, Any]]:
    """The parts of every rank, waiting until each rank wrote one or died on this node, or until
    ``timeout_s`` (3 s once SIGTERM came: the other ranks are being stopped too). A rank that
    died without a part is represented by what it left (``dead_ranks.dead_rank_part``)."""
    from nndoctor.run.distributed.dead_ranks import dead_here, dead_rank_part
    from nndoctor.run.distributed.parts import read_parts

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
