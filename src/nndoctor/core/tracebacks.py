"""Tracebacks as the user should see them: nndoctor's own frames left out.

nndoctor sits between python and the script (runpy, hooks, patched DataLoader fetchers), so a
raw traceback shows our frames, even inside the text of a DataLoader worker's "Original
Traceback". The user-facing one drops them; the full one is kept for the JSON report and
``NNDOCTOR_DEBUG=1``.
"""

from __future__ import annotations

import re
import traceback
from types import TracebackType

from nndoctor.core.user_code import is_tool_file


def user_traceback(error: BaseException) -> str:
    """The traceback as the user would see it under plain python: our frames removed, also
    from tracebacks quoted in the message (a DataLoader worker's "Original Traceback")."""
    exc = traceback.TracebackException.from_exception(error)
    stack = [exc]
    while stack:
        current = stack.pop()
        current.stack = traceback.StackSummary.from_list(
            [f for f in current.stack if not is_tool_file(f.filename)]
        )
        for nested in (current.__cause__, current.__context__):
            if nested is not None:
                stack.append(nested)
    return strip_own_frames("".join(exc.format()))


_FRAME_LINE = re.compile(r'^(?P<indent>[ \t]*)File "(?P<file>[^"]+)", line \d+')


def strip_own_frames(text: str) -> str:
    """Remove nndoctor's frames (a ``File "…", line N`` line and the lines indented below it)
    from traceback text."""
    kept: list[str] = []
    skipping_below: int | None = None
    for line in text.splitlines(keepends=True):
        match = _FRAME_LINE.match(line)
        if match:
            own = is_tool_file(match.group("file"))
            skipping_below = len(match.group("indent")) if own else None
            if own:
                continue
        elif skipping_below is not None:
            indent = len(line) - len(line.lstrip(" \t"))
            if line.strip() and indent > skipping_below:
                continue
            skipping_below = None
        kept.append(line)
    return "".join(kept)


def full_traceback(error: BaseException) -> str:
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))


def user_frames_only(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's first frame on, as python would hand it to a hook."""
    while tb is not None and is_tool_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb
