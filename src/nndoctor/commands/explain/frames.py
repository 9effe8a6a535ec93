"""Traceback entries: one frame, and the frames read from traceback text.

Both a live crash (whose message may quote a DataLoader worker's "Original Traceback") and a
pasted log (``tracetext``) read frames from text, so the parser lives here, below both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nndoctor.core.user_code import is_user_path

FRAME_LINE = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?\s*$')


@dataclass(frozen=True)
class Frame:
    """One traceback entry: where, which function, and the source line shown."""

    path: str
    line: int | None
    function: str = ""
    source: str = ""
    # Set for live frames from their code object; frames read from text use the path alone.
    user: bool | None = None

    @property
    def is_user(self) -> bool:
        return self.user if self.user is not None else is_user_path(self.path)


def parse_frames(lines: list[str]) -> tuple[list[Frame], int]:
    """Frames from traceback lines (after the header); returns them and the index after them."""
    frames: list[Frame] = []
    i = 0
    while i < len(lines):
        match = FRAME_LINE.match(lines[i])
        if not match:
            stripped = lines[i].strip()
            # Source lines, caret markers and "[Previous line repeated N more times]".
            if frames and (lines[i].startswith("    ") or stripped.startswith("[Previous line")):
                i += 1
                continue
            break
        source = ""
        if i + 1 < len(lines) and lines[i + 1].startswith("    ") and not FRAME_LINE.match(lines[i + 1]):
            source = lines[i + 1].strip()
        frames.append(Frame(match.group("path"), int(match.group("line")), (match.group("func") or "").strip(), source))
        i += 1
    return frames, i


def worker_traceback_frames(message: str) -> list[Frame]:
    """Frames of the "Original Traceback" a DataLoader worker's error carries in its message."""
    marker = message.find("Original Traceback (most recent call last):")
    if marker < 0:
        return []
    lines = message[marker:].splitlines()[1:]
    frames, _ = parse_frames(lines)
    return frames
