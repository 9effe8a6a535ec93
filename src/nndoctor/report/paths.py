"""Paths in machine-readable reports: relative to the repository root where possible."""

from __future__ import annotations

import os
from pathlib import Path


def report_root() -> Path:
    """The folder report paths are relative to: ``$GITHUB_WORKSPACE`` in Actions, else the
    working directory (code-scanning UIs and annotations resolve paths from the checkout)."""
    return Path(os.environ.get("GITHUB_WORKSPACE") or os.getcwd()).resolve()


def relative_path(path: str) -> str:
    """``path`` relative to ``report_root()`` with forward slashes, or as given when outside it."""
    try:
        return Path(path).resolve().relative_to(report_root()).as_posix()
    except (ValueError, OSError):
        return Path(path).as_posix()
