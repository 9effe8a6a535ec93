"""Errors nndoctor reports to the user as a clear message and a non-zero exit, never a traceback."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user (missing file, bad option, unreadable checkpoint …).

    The CLI prints ``nndoctor: error: <message>`` and exits with status 2.
    """

    exit_code = 2
