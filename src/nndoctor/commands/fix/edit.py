"""What ``nndoctor fix`` proposes: line hunks against the original file, and suggestions.

Every edit is expressed against the *original* text of its file, so edits of one file compose
(applied bottom-up) and any subset of them can be applied or rolled back independently; two
edits that touch the same lines are never applied together.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from nndoctor.core.findings import Finding

# The states an edit goes through (JSON ``status``).
PROPOSED, APPLIED, VERIFIED, ROLLED_BACK, SUGGESTION = (
    "proposed", "applied", "verified", "rolled-back", "suggestion")


@dataclass(frozen=True)
class Hunk:
    """Lines ``start``..``end`` (1-based, inclusive) of the original replaced by ``new_lines``;
    ``end == start - 1`` is a pure insertion before line ``start``."""

    start: int
    end: int
    new_lines: tuple[str, ...]
    # The replaced characters of the original text (SARIF's deletedRegion).
    char_offset: int = 0
    char_length: int = 0

    def overlaps(self, other: Hunk) -> bool:
        # Insertions at one place, or a hunk touching another's lines, cannot be ordered safely.
        return self.start <= max(other.end, other.start) and other.start <= max(self.end, self.start)

    @property
    def delta(self) -> int:
        return len(self.new_lines) - (self.end - self.start + 1)


def hunks_between(old: str, new: str) -> tuple[Hunk, ...]:
    """The line hunks that turn ``old`` into ``new``."""
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    starts = [0]
    for line in old_lines:
        starts.append(starts[-1] + len(line))
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    return tuple(Hunk(i1 + 1, i2, tuple(new_lines[j1:j2]), starts[i1], starts[i2] - starts[i1])
                 for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")


def apply_hunks(text: str, hunks: list[Hunk]) -> str:
    """``text`` with non-overlapping ``hunks`` applied (bottom-up, so line numbers hold)."""
    lines = text.splitlines(keepends=True)
    for hunk in sorted(hunks, key=lambda h: (h.start, h.end), reverse=True):
        lines[hunk.start - 1:hunk.end] = list(hunk.new_lines)
    return "".join(lines)


def map_line(line: int, hunks: list[Hunk]) -> int:
    """Where original line ``line`` is after ``hunks`` (a replaced line: its hunk's start)."""
    shift = 0
    for hunk in sorted(hunks, key=lambda h: h.start):
        if hunk.end < line:
            shift += hunk.delta
        elif hunk.start <= line <= hunk.end:
            return hunk.start + shift
    return line + shift


@dataclass
class Edit:
    """One code's change of one file (or a suggestion, when ``hunks`` is empty)."""

    code: str
    path: str  # absolute path of the edited file
    title: str  # what the change does, in the user's words ("add shuffle=True to the DataLoader")
    finding: Finding | None = None
    hunks: tuple[Hunk, ...] = ()
    safe: bool = True
    status: str = PROPOSED
    reason: str = ""  # why a suggestion was not made an edit, or why an edit was rolled back
    display_path: str = ""  # the path as the report shows it
    findings: list[Finding] = field(default_factory=list)  # every finding this edit answers
    # In a notebook: the lines in the cell (display_path names the cell); hunks stay in the
    # hidden script's lines, so no SARIF fix is offered for them.
    cell_range: tuple[int, int] | None = None

    @property
    def is_suggestion(self) -> bool:
        return self.status == SUGGESTION

    @property
    def line_range(self) -> tuple[int, int]:
        if not self.hunks:
            line = self.finding.location.line if self.finding and self.finding.location else 0
            return (line or 0, line or 0)
        return (min(h.start for h in self.hunks), max(max(h.end, h.start) for h in self.hunks))

    @property
    def shown_range(self) -> tuple[int, int]:
        return self.cell_range or self.line_range

    def to_json(self) -> dict[str, Any]:
        start, end = self.shown_range
        data: dict[str, Any] = {
            "file": self.display_path or self.path,
            "range": {"start_line": start, "end_line": end},
            "code": self.code,
            "title": self.title,
            "safety": "safe" if self.safe else "unsafe",
            "status": self.status,
            "applied": self.status in (APPLIED, VERIFIED),
            "verified": self.status == VERIFIED,
        }
        if self.reason:
            data["reason"] = self.reason
        if self.hunks and self.cell_range is None:
            data["hunks"] = [{"start_line": h.start, "end_line": h.end, "new_text": "".join(h.new_lines)}
                             for h in self.hunks]
        return data
