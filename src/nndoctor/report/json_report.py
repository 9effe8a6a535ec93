"""The JSON reporter: the stable, versioned schema 1 (extended, never broken)."""

from __future__ import annotations

import json
import os
from typing import IO

from nndoctor.core._version import __version__
from nndoctor.core.findings import Report
from nndoctor.util.atomic import atomic_write_text


def render_json(report: Report) -> str:
    return json.dumps(report.to_json(__version__), indent=2, ensure_ascii=False) + "\n"


def write_json(report: Report, path: str | os.PathLike[str], *, stdout: IO[str] | None = None) -> None:
    """Write the report atomically; ``-`` means standard output (``stdout``, default
    ``sys.stdout``); a device or FIFO is written through (``nndoctor.util.atomic``)."""
    text = render_json(report)
    if str(path) == "-":
        import sys

        stream = stdout or sys.stdout
        stream.write(text)
        stream.flush()
        return
    atomic_write_text(path, text)
