"""Ranks that died without writing a part: which ones, of what, and what they were doing.

A rank of this node that registered itself (``alive-rank-N.json``), wrote no part and whose
process no longer runs died without Python: its fatal-signal trace (faulthandler), its flight
record and the tail of its stderr (when torchrun keeps it: ``--redirects``/``--tee`` with
``--log-dir``) say how, and they become the rank's part in the merged report.
"""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path
from typing import Any

from nndoctor.run.distributed.flight import fatal_path, read_alive, read_flight

# faulthandler's first line for each fatal signal it handles.
_FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
_MAX_TRACE_LINES = 40
# What a C++ runtime or PyTorch prints before aborting: the native error worth quoting.
_NATIVE_ERROR = re.compile(r"terminate called|what\(\):|\[enforce fail|NCCL error|ncclInternalError|"
                           r"ProcessGroupNCCL|Watchdog caught collective|RuntimeError|CUDA error")


def pid_alive(pid: int) -> bool:
    """Is the process running (a zombie waiting to be reaped by torchrun counts as dead)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def dead_here(folder: str, rank: int) -> dict[str, Any] | None:
    """The registration of ``rank`` when it ran on this host and its process has ended."""
    alive = read_alive(folder, rank)
    if alive is None or alive.get("host") != socket.gethostname():
        return None
    pid = alive.get("pid")
    if not isinstance(pid, int) or pid == os.getpid() or pid_alive(pid):
        return None
    return alive


def _fatal_trace(folder: str, rank: int) -> tuple[str | None, str | None]:
    """(signal name, faulthandler's dump) from the rank's fatal file."""
    try:
        text = fatal_path(folder, rank).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None, None
    if not text:
        return None, None
    for words, name in _FATAL_SIGNALS.items():
        if f"Fatal Python error: {words}" in text:
            return name, "\n".join(text.splitlines()[:_MAX_TRACE_LINES])
    return None, "\n".join(text.splitlines()[:_MAX_TRACE_LINES])


def native_error(log_dir: str | None) -> str | None:
    """The native error the rank printed last (torchrun's stderr log of the rank), if kept."""
    if not log_dir:
        return None
    path = Path(log_dir) / "stderr.log"
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 16_000))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        if "terminate called" in lines[index]:
            return "\n".join(lines[index:index + 3])
    matches = [line for line in lines if _NATIVE_ERROR.search(line)]
    return matches[-1] if matches else None


def dead_rank_part(folder: str, rank: int, alive: dict[str, Any],
                   exitcode: int | None = None) -> dict[str, Any]:
    """A part standing in for a rank that died without writing one (``exitcode``: its exit
    status where this process started it, negative for a signal)."""
    signal_name, trace = _fatal_trace(folder, rank)
    flight = read_flight(folder, rank)
    inferred = False
    if exitcode is not None and exitcode < 0:
        try:
            signal_name = signal.Signals(-exitcode).name
        except ValueError:
            signal_name = f"signal {-exitcode}"
    elif exitcode is not None and signal_name is None:
        signal_name = f"exit code {exitcode}"
    if signal_name is None:
        # Without faulthandler's trace the signal is inferred: Python catches every other ending.
        signal_name, inferred = "SIGKILL", True
    died = {
        "signal": signal_name,
        "signal_inferred": inferred,
        "native_error": native_error(alive.get("log_dir")),
        "torchrun": bool(alive.get("torchrun")),
        "fatal_trace": trace,
        "flight": flight,
    }
    report = {"status": "died", "steps": (flight or {}).get("step", 0), "findings": [],
              "internal_errors": []}
    return {"rank": rank, "world_size": alive.get("world_size"), "pid": alive.get("pid"),
            "host": alive.get("host"), "report": report, "data": {"flight": flight}, "died": died}


def dead_parts(folder: str, ranks: list[int]) -> list[dict[str, Any]]:
    """Parts for those of ``ranks`` that died on this host."""
    parts = []
    for rank in ranks:
        alive = dead_here(folder, rank)
        if alive is not None:
            parts.append(dead_rank_part(folder, rank, alive))
    return parts


def dead_children(folder: str, parts: list[dict[str, Any]], exitcodes: dict[int, int | None]) -> list[dict[str, Any]]:
    """Parts for the processes the script started (registered in ``folder``) that wrote none;
    ``exitcodes``: pid -> exit status, known to the process that started them."""
    reported = {p.get("pid") for p in parts}
    found = []
    for path in sorted(Path(folder).glob("alive-rank-*.json")):
        index = int(path.stem.rsplit("-", 1)[1])
        alive = read_alive(folder, index)
        pid = (alive or {}).get("pid")
        if alive is None or pid in reported or not isinstance(pid, int) or pid_alive(pid):
            continue
        found.append(dead_rank_part(folder, index, alive, exitcodes.get(pid)))
    return found
