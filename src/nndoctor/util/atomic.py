"""Writing nndoctor's outputs: a report or a repaired checkpoint is either complete or absent.

Atomic rename (write a temporary file beside the target, then ``os.replace``) is for regular
files only. A character device (``/dev/null``, a terminal), a FIFO, or the process's own
streams (``/dev/stdout``, ``/dev/fd/N``) are written *through*, never replaced: renaming over
``/dev/null`` as root would turn the device node into a plain file for every program on the
machine, and ``/dev/stdout`` redirected to a file must get the report appended, not a new file.
Anything else that cannot hold a report (a directory, a block device, a socket) is refused with
a clear message.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from nndoctor.util.errors import UsageError
from nndoctor.util.sanitize import printable

# Paths that name an open stream of this process, whatever they resolve to.
_STREAM_PATH = re.compile(r"^/dev/(?:stdout|stderr|fd/\d+)$|^/proc/(?:self|thread-self|\d+)/fd/\d+$")
# How long to wait for a reader to open a FIFO before giving up (never hang on a FIFO).
FIFO_WAIT_S = 5.0


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", **kwargs) -> Iterator[IO]:
    """Write ``path`` so that readers never see a half-written file.

    A regular (or new) file is written to a temporary file beside it and renamed into place on
    success; an error leaves any previous file intact. A device, FIFO or ``/dev/stdout``-like
    path is written through (see the module docstring); a directory, block device or socket is
    refused with ``IsADirectoryError`` / ``OSError``.
    """
    target = Path(path)
    kind = _special_kind(target)
    if kind is not None:
        with _open_through(target, kind, mode, **kwargs) as handle:
            yield handle
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def prepare_output_path(path: str | os.PathLike[str], option: str = "--json") -> str:
    """Check an output path before any work starts and return it absolute (``-`` stays ``-``).

    Raises ``UsageError`` (one line, exit status 2) when the report could not be written there:
    the path is a directory, lies below a file, or its folder is not writable. Resolving it now
    keeps a relative path relative to where nndoctor was started, even if the script calls
    ``os.chdir``. A FIFO is not opened here (that would end its reader's input).
    """
    text = os.fspath(path)
    if text == "-":
        return text
    shown = _shown(text)
    if not text:
        raise UsageError(f"{option}: empty path")
    absolute = os.path.abspath(text)
    if _STREAM_PATH.match(absolute):
        return absolute  # /dev/stdout and the like: written through at the end
    try:
        info = os.stat(absolute)
    except FileNotFoundError:
        info = None
    except NotADirectoryError:
        raise UsageError(f"{option} {shown}: {_shown(_file_above(absolute))} is a file, not a folder") from None
    except OSError as error:
        raise UsageError(f"{option} {shown}: {error.strerror or error}") from None
    if info is not None:
        problem = _unwritable_kind(info.st_mode)
        if problem:
            raise UsageError(f"{option} {shown}: {problem}")
        if not stat.S_ISREG(info.st_mode):
            return absolute  # a device or FIFO: written through at the end
    folder = _nearest_existing(os.path.dirname(absolute))
    if not os.path.isdir(folder):
        raise UsageError(f"{option} {shown}: {_shown(folder)} is a file, not a folder")
    if not _can_create_in(folder):
        raise UsageError(f"{option} {shown}: cannot write in {_shown(folder)} (permission denied or read-only)")
    return absolute


def describe_write_error(path: str | os.PathLike[str], error: OSError) -> str:
    """One line for a report that could not be written at the end of a run."""
    reason = error.strerror or str(error)
    return f"nndoctor: could not write {_shown(os.fspath(path))}: {_shown(reason)}"


# -- helpers ---------------------------------------------------------------------------------
def _shown(text: str) -> str:
    """A path as it may be printed on a terminal (control characters escaped)."""
    return printable(text, keep_newlines=False)


def _special_kind(target: Path) -> str | None:
    """'stream' for paths to write through, None for a regular or new file; raise for the rest."""
    is_stream = bool(_STREAM_PATH.match(os.path.abspath(target)))
    try:
        info = os.stat(target)
    except FileNotFoundError:
        if is_stream:  # a closed descriptor: never create a file in /dev or /proc in its place
            raise OSError(errno.EBADF, "the stream is closed", str(target)) from None
        return None
    except OSError:
        if is_stream:
            raise
        return None  # let the ordinary path report it (ENOTDIR, EACCES …)
    problem = _unwritable_kind(info.st_mode)
    if problem:
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, problem, str(target))
        raise OSError(errno.EINVAL, problem, str(target))
    if stat.S_ISFIFO(info.st_mode):
        return "fifo"
    if not stat.S_ISREG(info.st_mode):
        return "device"
    if is_stream:
        return "stream"  # /dev/stdout redirected to a file: append, never rename or truncate
    return None


def _unwritable_kind(mode: int) -> str | None:
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISBLK(mode):
        return "is a block device; refusing to write a report onto it"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a file"
    return None


@contextlib.contextmanager
def _open_through(target: Path, kind: str, mode: str, **kwargs) -> Iterator[IO]:
    flags = os.O_WRONLY | os.O_NOCTTY
    if kind == "stream":
        flags |= os.O_APPEND
    if kind == "fifo":
        fd = _open_fifo(target, flags)
    else:
        # Non-blocking open: a device that waits on open (a serial line without carrier) must
        # not hang the end of a run; writes block normally afterwards.
        fd = _blocking(os.open(target, flags | os.O_NONBLOCK))
    with os.fdopen(fd, mode.replace("x", "w"), **kwargs) as handle:
        yield handle
        handle.flush()


def _open_fifo(target: Path, flags: int) -> int:
    """Open a FIFO for writing without blocking forever when nobody reads it."""
    deadline = time.monotonic() + FIFO_WAIT_S
    while True:
        try:
            fd = os.open(target, flags | os.O_NONBLOCK)
            break
        except OSError as error:
            if error.errno != errno.ENXIO or time.monotonic() >= deadline:
                if error.errno == errno.ENXIO:
                    raise OSError(errno.ENXIO, f"no process read the FIFO within {FIFO_WAIT_S:g} s",
                                  str(target)) from None
                raise
            time.sleep(0.05)
    # Blocking writes from here on: a reader that is slow must not lose the end of the report.
    return _blocking(fd)


def _blocking(fd: int) -> int:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def _nearest_existing(folder: str) -> str:
    while folder and not os.path.lexists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return folder or os.sep


def _file_above(path: str) -> str:
    folder = os.path.dirname(path)
    while folder and folder != os.path.dirname(folder):
        if os.path.exists(folder) and not os.path.isdir(folder):
            return folder
        folder = os.path.dirname(folder)
    return os.path.dirname(path)


def _can_create_in(folder: str) -> bool:
    """Try it: permission bits say nothing for root or on a read-only mount."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".nndoctor-probe.", dir=folder)
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return True
