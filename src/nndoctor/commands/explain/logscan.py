"""Reading causes out of a log's lines that are not Python exceptions.

Many crashes never print a Python exception users can paste: NCCL's watchdog logs
``[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(…)`` through c10's logger and
aborts the process, cuDNN's loader prints ``Could not load library libcudnn_ops_infer.so.8``
and aborts, a DataLoader worker prints ``ERROR: Unexpected bus error encountered in worker``
(often glued to a progress bar). Other causes show only as a warning (Keras's ``from_logits=True``
with a Softmax output, dynamo's ``hit config.recompile_limit (8)``).

An explanation lists the exact wordings that identify its cause on one line of their own in
``log_lines`` (errors) and ``warning_lines`` (warnings). ``scan`` looks up each wording's
literal start (its ``anchor``) with ``str.find`` over the whole log, runs the wording's
expression on those lines only, and returns a ``LogHit`` per explanation: its first line, how
many lines carried it, and whether it was a warning. A line counts only for the explanation whose
wording it carries, and only if that explanation's own ``match`` then accepts the line: so a
hit gives the same facts as the exception would.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING

from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.pasted import find_error_line
from nndoctor.core.findings import Finding

if TYPE_CHECKING:
    from nndoctor.commands.explain.base import CrashExplanation

# A line of a progress bar redrawn with \r may end with the message that killed the run
# ("… 32/500 [00:10<02:31]ERROR: Unexpected bus error …"): the text after the last \r is
# what the terminal showed, and the hit keeps at most this much of it.
_MAX_LINE_CHARS = 2000


@dataclass
class LogHit:
    """The lines of a log that carry one explanation's wording."""

    explanation: type[CrashExplanation]
    line_number: int  # 1-based, of the first line that carried it
    line: str  # that line, cleaned of prefixes
    warning: bool
    count: int = 1
    more: list[int] = field(default_factory=list)  # a few later line numbers
    # The lines after it that continue its message (``log_context_lines`` of the explanation).
    continuation: list[str] = field(default_factory=list)

    def crash(self) -> Crash:
        """The line as a crash for the explanation's ``match``/``build``: its message is the line
        and its declared continuation alone, so nothing else around it can supply a wording."""
        message = "\n".join([self.line, *self.continuation])
        typed = find_error_line(self.line)
        if typed is not None:
            return Crash(exc_type=typed.group("type"), message="\n".join([typed.group("msg"), *self.continuation]))
        return Crash(exc_type="Warning" if self.warning else "Error", message=message.strip())


_METACHARACTERS = frozenset(".^$*+?{}[]|()")
_QUANTIFIERS = frozenset("?*+{")
# Escapes that stand for one literal character.
_LITERAL_ESCAPES = frozenset(".^$*+?{}[]|()\\/`'\"-=:<> ")
# The shortest literal that may stand for a wording in the pre-filter.
MIN_ANCHOR_CHARS = 8


def anchor(wording: str) -> str | None:
    """The literal text every match of ``wording`` starts with (its leading run of plain
    characters, escapes undone; a character under a quantifier ends it), or None when it is
    shorter than ``MIN_ANCHOR_CHARS``. ``str.find`` of anchors over the whole log is what keeps
    the scan fast: the wording's regular expression then runs on the few lines that hold one."""
    literal: list[str] = []
    i = 0
    while i < len(wording):
        if wording[i] == "\\":
            if i + 1 >= len(wording) or wording[i + 1] not in _LITERAL_ESCAPES:
                break
            char, width = wording[i + 1], 2
        elif wording[i] in _METACHARACTERS:
            break
        else:
            char, width = wording[i], 1
        if i + width < len(wording) and wording[i + width] in _QUANTIFIERS:
            break
        literal.append(char)
        i += width
    text = "".join(literal)
    return text if len(text) >= MIN_ANCHOR_CHARS else None


@dataclass
class _Wording:
    explanation: type[CrashExplanation]
    warning: bool
    pattern: re.Pattern[str]
    anchor: str | None


def _wordings(explanations: Iterable[type[CrashExplanation]]) -> list[_Wording]:
    found = []
    for cls in explanations:
        for warning, wordings in ((False, cls.log_lines), (True, cls.warning_lines)):
            found += [_Wording(cls, warning, re.compile(w), anchor(w)) for w in wordings]
    return found


def _candidate_lines(text: str, wording: _Wording, starts: list[int]) -> Iterable[int]:
    """Indexes of the lines that may carry ``wording``: those holding its anchor (all lines
    when it has none)."""
    if wording.anchor is None:
        yield from range(len(starts))
        return
    position = text.find(wording.anchor)
    while position != -1:
        index = bisect_right(starts, position) - 1
        yield index
        # On to the next line: one hit per line is enough.
        following = text.find("\n", position)
        if following == -1:
            return
        position = text.find(wording.anchor, following + 1)


def scan(text: str, explanations: Iterable[type[CrashExplanation]]) -> list[LogHit]:
    """Every explanation whose wording some line of ``text`` (already cleaned) carries, in the
    order of their first line. Linear in the size of the log: each wording's anchor is looked
    up with ``str.find``, and its expression runs only on the lines that hold the anchor."""
    wordings = _wordings(explanations)
    if not wordings:
        return []
    lines = text.split("\n")
    starts = list(accumulate((len(line) + 1 for line in lines[:-1]), initial=0))
    matched: dict[tuple[str, bool], dict[int, tuple[_Wording, re.Match[str]]]] = {}
    for wording in wordings:
        key = (wording.explanation.__qualname__, wording.warning)
        for index in _candidate_lines(text, wording, starts):
            found = wording.pattern.search(lines[index])
            if found is not None:
                matched.setdefault(key, {}).setdefault(index, (wording, found))
    hits = []
    for by_line in matched.values():
        indexes = sorted(by_line)
        # The first line whose facts the explanation accepts is the evidence; all count.
        hit = next((h for i in indexes if (h := _hit(*by_line[i], lines, i)) is not None), None)
        if hit is not None:
            hit.count = len(indexes)
            hit.more = [i + 1 for i in indexes if i + 1 != hit.line_number][:3]
            hits.append(hit)
    return sorted(hits, key=lambda h: h.line_number)


def _hit(wording: _Wording, found: re.Match[str], lines: list[str], index: int) -> LogHit | None:
    cls = wording.explanation
    line = lines[index]
    # From the message on: what a progress bar drew before it on the same line is not the message.
    start = line.rfind("\r", 0, found.start()) + 1
    hit = LogHit(cls, index + 1, line[start:start + _MAX_LINE_CHARS].strip(), wording.warning,
                 continuation=[text[:_MAX_LINE_CHARS] for text in lines[index + 1:index + 1 + cls.log_context_lines]])
    return hit if cls.match(hit.crash()) is not None else None


def finding_from_line(hit: LogHit) -> Finding:
    """The explanation of ``hit``, saying which log line(s) carried it (a log line has no
    ``file:line`` of the user's code: the line number in the log is the evidence)."""
    crash = hit.crash()
    facts = hit.explanation.match(crash) or {}
    finding = hit.explanation.build(crash, facts)
    where = f"log line {hit.line_number}"
    if hit.count > 1:
        where += f" and {hit.count - 1} more line{'s' if hit.count > 2 else ''}"
    if hit.warning:
        finding.message = f"A warning in the log ({where}) names this cause: {finding.message}"
    else:
        finding.message = f"{finding.message} (from {where}, not a Python exception)"
    finding.evidence["log_line"] = hit.line_number
    if hit.count > 1:
        finding.evidence["log_lines_with_it"] = hit.count
    finding.evidence["log_text"] = hit.line[:240]
    return finding
