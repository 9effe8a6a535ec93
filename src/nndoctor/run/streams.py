"""nndoctor's own standard streams, kept apart from whatever the user's script does to them.

A script may close ``sys.stdout``, set ``sys.stderr = None``, replace it with a log file, or
``os.dup2`` a file over descriptor 2. The report must still reach the terminal (or wherever
nndoctor's stderr went) and ``--json -`` must still reach nndoctor's stdout. So the stream
objects are saved before the script runs, with a duplicate of their descriptors as a fallback
for when the objects themselves were closed or their descriptor now points elsewhere.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import IO

_NAMES = ("stdout", "stderr")


class OriginalStreams:
    """Private handles to ``sys.stdout`` / ``sys.stderr`` as they were when created."""

    def __init__(self) -> None:
        self._objects: dict[str, IO[str] | None] = {name: getattr(sys, name) for name in _NAMES}
        self._fds: dict[str, int | None] = {name: _dup_of(self._objects[name]) for name in _NAMES}
        self._wrappers: dict[str, IO[str]] = {}

    # -- the streams -------------------------------------------------------------------------
    @property
    def stdout(self) -> IO[str]:
        return self._stream("stdout")

    @property
    def stderr(self) -> IO[str]:
        return self._stream("stderr")

    def flush_stdout(self) -> None:
        """Flush the script's buffered stdout before the report (never raises)."""
        for stream in (sys.stdout, self._objects["stdout"]):
            with contextlib.suppress(Exception):
                if stream is not None and not getattr(stream, "closed", False):
                    stream.flush()

    def restore(self) -> None:
        """Give ``sys.stdout`` / ``sys.stderr`` back to nndoctor after the script: the saved
        objects, or writers on the saved descriptors when the script closed them, so any code
        that writes to ``sys.stdout`` afterwards (a JSON report on ``-``) reaches the right place."""
        for name in _NAMES:
            setattr(sys, name, self._stream(name))

    def close(self) -> None:
        for wrapper in self._wrappers.values():
            with contextlib.suppress(Exception):
                wrapper.flush()
        self._wrappers.clear()
        for name, fd in list(self._fds.items()):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds[name] = None

    # -- internals ---------------------------------------------------------------------------
    def _stream(self, name: str) -> IO[str]:
        saved, fd = self._objects[name], self._fds[name]
        if _usable(saved) and (fd is None or _same_file(saved, fd)):
            return saved  # type: ignore[return-value]
        if fd is not None:
            if name not in self._wrappers:
                encoding = getattr(saved, "encoding", None) or "utf-8"
                self._wrappers[name] = io.TextIOWrapper(
                    io.FileIO(fd, "w", closefd=False), encoding=encoding, errors="backslashreplace",
                    line_buffering=True, write_through=True,
                )
            return self._wrappers[name]
        fallback: IO[str] | None = getattr(sys, f"__{name}__", None)
        return fallback if fallback is not None and _usable(fallback) else io.StringIO()  # nowhere left to write


def _usable(stream: object) -> bool:
    return stream is not None and not getattr(stream, "closed", False) and hasattr(stream, "write")


def _dup_of(stream: object) -> int | None:
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]  # AttributeError caught: any object
        return os.dup(fd)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _same_file(stream: object, fd: int) -> bool:
    """Does the saved stream still write where it did (no ``os.dup2`` over its descriptor)?"""
    try:
        now, then = os.fstat(stream.fileno()), os.fstat(fd)  # type: ignore[attr-defined]  # AttributeError caught
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return True  # not backed by a descriptor (a test's capture buffer): the object is all there is
    return (now.st_dev, now.st_ino) == (then.st_dev, then.st_ino)
