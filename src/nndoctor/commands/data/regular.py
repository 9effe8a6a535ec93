"""Opening dataset files without ever blocking on a FIFO or reading a device.

``stat`` first and ``open`` after leaves a window in which the path can be swapped for a FIFO;
opening with O_NONBLOCK and checking the opened descriptor closes it.
"""

from __future__ import annotations

import os
import stat
from typing import IO


class NotARegularFile(OSError):
    """A FIFO, socket or device where a data file was expected: reading it could block forever."""


def open_regular(path: str) -> IO[bytes]:
    """Open ``path`` for reading only if it is a regular file.

    O_NONBLOCK makes opening a FIFO return at once instead of waiting for a writer; fstat on
    the opened descriptor then decides, so a file swapped after a stat() cannot slip through.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile("not a regular file (a FIFO, socket or device): not read")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
