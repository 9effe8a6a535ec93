"""Reading causes out of a log's lines that are not Python exceptions.

Many crashes never print a Python exception users can paste: NCCL's watchdog logs
``[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(…)`` through c10's logger and
aborts the process, cuDNN's loader prints ``Could not load library libcudnn_ops_infer.so.8``
and aborts, a DataLoader worker prints ``ERROR: Unexpected bus error encountered in worker``
(often glued to a progress bar). Other causes show only as a warning (Keras's ``from_logits=True``
with a Softmax output, dynamo's ``hit config.recompile_limit (8)``).

An explanation lists the exact wordings that identify its cause on one line of their own in
``log_lines`` (errors) and ``warning_lines`` (warnings). ``scan`` finds every such line in one
pass over the log and returns a ``LogHit`` per explanation: its first line, how many lines
carried it, and whether it was a warning. A line counts only for the explanation whose
wording it carries, and only if that explanation's own ``match`` then accepts the line: so a
hit gives the same facts as the exception would.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nndoctor.explain.crash import Crash
from nndoctor.explain.pasted import find_error_line
from nndoctor.findings import Finding

if TYPE_CHECKING:
    from nndoctor.explain.base import CrashExplanation

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


def _combined(explanations: Iterable[type[CrashExplanation]]) -> tuple[re.Pattern[str] | None, dict[str, tuple[type[CrashExplanation], bool]]]:
    groups: dict[str, tuple[type[CrashExplanation], bool]] = {}
    parts = []
    for index, cls in enumerate(explanations):
        for warning, wordings in ((False, cls.log_lines), (True, cls.warning_lines)):
            for number, wording in enumerate(wordings):
                name = f"w{index}_{int(warning)}_{number}"
                groups[name] = (cls, warning)
                parts.append(f"(?P<{name}>{wording})")
    return (re.compile("|".join(parts)) if parts else None), groups


def scan(lines: list[str], explanations: Iterable[type[CrashExplanation]]) -> list[LogHit]:
    """Every explanation whose wording some line of ``lines`` (already cleaned) carries, in the
    order of their first line. Linear in the size of the log: one search per line."""
    pattern, groups = _combined(explanations)
    if pattern is None:
        return []
    hits: dict[tuple[str, bool], LogHit] = {}
    for number, line in enumerate(lines, start=1):
        found = pattern.search(line)
        if found is None or found.lastgroup not in groups:
            continue
        cls, warning = groups[found.lastgroup]
        key = (cls.__qualname__, warning)
        known = hits.get(key)
        if known is not None:
            known.count += 1
            if len(known.more) < 3:
                known.more.append(number)
            continue
        # From the message on: what a progress bar drew before it on the same line is not the message.
        start = line.rfind("\r", 0, found.start()) + 1
        hit = LogHit(cls, number, line[start:start + _MAX_LINE_CHARS].strip(), warning,
                     continuation=[text[:_MAX_LINE_CHARS] for text in lines[number:number + cls.log_context_lines]])
        if cls.match(hit.crash()) is None:
            continue  # the explanation's own facts are not on the line: not its evidence
        hits[key] = hit
    return sorted(hits.values(), key=lambda h: h.line_number)


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
