"""A flight record per rank: what it was doing, kept where a rank killed without warning leaves it.

A rank that dies of SIGKILL, a segfault or a C++ abort (gloo's ``EnforceNotMet``, NCCL's
watchdog) runs no Python code on the way out, so it cannot write a report part. Like NCCL's
flight recorder, each rank therefore notes *before* each collective and at each backward and optimizer step
what it is doing, into a small memory-mapped file of the parts folder: the page cache keeps what
was written when the process is killed, and a write is one ``struct.pack_into`` (no system call).

Per rank, in the node's parts folder:

- ``alive-rank-N.json``: written once at the start (pid, host, where torchrun keeps the rank's
  stderr when run with ``--redirects``/``--tee``), so the others can tell a dead rank from a slow one;
- ``flight-rank-N.bin``: the record (last step, phase, last collective entered: op, element
  count, dtype, the user's line);
- ``fatal-rank-N.txt``: Python's faulthandler output on a fatal signal (SIGSEGV, SIGABRT,
  SIGBUS, SIGFPE, SIGILL): the signal's name and every thread's Python stack.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import mmap
import os
import socket
import struct
import sys
from pathlib import Path
from typing import Any

from nndoctor.util.atomic import atomic_write_text

# Three regions, each written only when it changes, so that a step costs one small pack_into:
# the state (written every step): seq, step, phase code, in a collective, DDP model;
_STATE = struct.Struct("<QqBBB")
# the last collective entered: collectives entered, element count, op, dtype, user line;
_COLLECTIVE = struct.Struct("<Qq32s16s160s")
_COLLECTIVE_AT = 32
# the user line of the phase (a backward's line).
_WHERE = struct.Struct("<160s")
_WHERE_AT = _COLLECTIVE_AT + _COLLECTIVE.size
_SIZE = 512
assert _STATE.size <= _COLLECTIVE_AT and _WHERE_AT + _WHERE.size <= _SIZE
PHASES = ("started", "backward", "after backward", "after step")


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def alive_path(folder: str, rank: int) -> Path:
    return Path(folder) / f"alive-rank-{rank}.json"


def flight_path(folder: str, rank: int) -> Path:
    return Path(folder) / f"flight-rank-{rank}.bin"


def fatal_path(folder: str, rank: int) -> Path:
    return Path(folder) / f"fatal-rank-{rank}.txt"


def torchrun_log_dir(environ: Any = None) -> str | None:
    """The folder where torchrun keeps this rank's stdout/stderr logs (``--log-dir``,
    ``--redirects``/``--tee``): the one holding its ``TORCHELASTIC_ERROR_FILE``."""
    env = os.environ if environ is None else environ
    error_file = env.get("TORCHELASTIC_ERROR_FILE")
    return os.path.dirname(error_file) if error_file else None


class FlightRecorder:
    """This rank's record, written in place (never raises into the run once opened)."""

    def __init__(self, folder: str, rank: int, world_size: int) -> None:
        self.folder, self.rank = folder, rank
        os.makedirs(folder, exist_ok=True)
        path = flight_path(folder, rank)
        with open(path, "wb") as handle:
            handle.write(b"\0" * _SIZE)
        self._file = open(path, "r+b")  # noqa: SIM115 - kept open for the mapping's lifetime
        self._map = mmap.mmap(self._file.fileno(), _SIZE)
        self._seq = 0
        self.step, self.count, self.numel = 0, 0, 0
        self.in_collective, self.ddp = False, False
        self.phase, self.op, self.dtype, self.location, self.phase_location = "started", "", "", "", ""
        self._fatal: Any = None
        self._faulthandler_before: bool | None = None
        atomic_write_text(alive_path(folder, rank), json.dumps({
            "rank": rank, "world_size": world_size, "pid": os.getpid(), "host": socket.gethostname(),
            "log_dir": torchrun_log_dir(), "torchrun": "TORCHELASTIC_RUN_ID" in os.environ,
        }))
        self._write()

    # -- writing -------------------------------------------------------------------------
    def _write(self) -> None:
        # One pack_into: a memory copy of a few bytes, done before a kill can land.
        self._seq += 1
        _STATE.pack_into(self._map, 0, self._seq, self.step, PHASES.index(self.phase),
                         self.in_collective, self.ddp)

    def _write_where(self) -> None:
        _WHERE.pack_into(self._map, _WHERE_AT, self.phase_location.encode()[-160:])

    def note_phase(self, phase: str, step: int, location: str | None = None) -> None:
        self.phase, self.step = phase, step
        self.in_collective = False
        if location is not None and location != self.phase_location:
            self.phase_location = location
            self._write_where()
        self._write()

    def enter(self, op: str, numel: int, dtype: str, location: str) -> None:
        self.op, self.numel, self.dtype, self.location = op, numel, dtype, location
        self.in_collective = True
        self.count += 1
        _COLLECTIVE.pack_into(self._map, _COLLECTIVE_AT, self.count, numel, op.encode()[:32],
                              dtype.encode()[:16], location.encode()[-160:])
        self._write()

    def leave(self) -> None:
        self.in_collective = False
        self._write()

    def snapshot(self) -> dict[str, Any]:
        return {"step": self.step, "collectives": self.count, "in_collective": self.in_collective,
                "ddp": self.ddp, "phase": self.phase, "op": self.op, "numel": self.numel,
                "dtype": self.dtype, "location": self.location, "phase_location": self.phase_location}

    # -- fatal signals -------------------------------------------------------------------
    def catch_fatal_signals(self) -> None:
        """Route faulthandler's dump of a fatal signal into this rank's fatal file (the
        surviving ranks read it); the signal still kills the process exactly as before."""
        self._faulthandler_before = faulthandler.is_enabled()
        self._fatal = open(fatal_path(self.folder, self.rank), "w")  # noqa: SIM115 - open until uninstall
        faulthandler.enable(file=self._fatal, all_threads=True)

    def close(self) -> None:
        """Give faulthandler back as it was (on stderr when it was on before)."""
        if self._fatal is not None:
            with contextlib.suppress(Exception):
                faulthandler.disable()
                if self._faulthandler_before:
                    faulthandler.enable(file=sys.stderr, all_threads=True)
            with contextlib.suppress(OSError):
                self._fatal.close()
                os.unlink(self._fatal.name)
            self._fatal = None
        with contextlib.suppress(Exception):
            self._map.close()
            self._file.close()


def read_flight(folder: str, rank: int) -> dict[str, Any] | None:
    """The last record of ``rank`` (None when it has none)."""
    try:
        raw = flight_path(folder, rank).read_bytes()
    except OSError:
        return None
    if len(raw) < _SIZE:
        return None
    seq, step, phase, inside, ddp = _STATE.unpack_from(raw, 0)
    if seq == 0:
        return None  # never written
    count, numel, op, dtype, location = _COLLECTIVE.unpack_from(raw, _COLLECTIVE_AT)
    (phase_location,) = _WHERE.unpack_from(raw, _WHERE_AT)
    return {"step": step, "collectives": count, "in_collective": bool(inside), "ddp": bool(ddp),
            "phase": PHASES[phase] if phase < len(PHASES) else "started", "op": _text(op),
            "numel": numel, "dtype": _text(dtype), "location": _text(location),
            "phase_location": _text(phase_location)}


def read_alive(folder: str, rank: int) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(alive_path(folder, rank).read_text(encoding="utf-8"))
        return data
    except (OSError, ValueError):
        return None


def remove_records(folder: str, ranks: Any) -> None:
    for rank in ranks:
        for path in (alive_path(folder, rank), flight_path(folder, rank), fatal_path(folder, rank)):
            with contextlib.suppress(OSError):
                path.unlink()


def registered_ranks(folder: str) -> list[int]:
    """The ranks that registered in this node's folder."""
    ranks = []
    for path in Path(folder).glob("alive-rank-*.json"):
        try:
            ranks.append(int(path.stem.rsplit("-", 1)[1]))
        except ValueError:
            continue
    return sorted(ranks)
