"""What torch._dynamo records about recompilations and graph breaks, read as plain data.

Dynamo keeps, whatever TORCH_LOGS says, two process-wide records that P113 reads (never
writes): ``torch._dynamo.utils.guard_failures`` (original code object -> the guard-failure
strings that ``TORCH_LOGS=recompiles`` would print, one per stale cache entry on each
recompilation) and ``torch._dynamo.utils.graph_break_reasons`` (one ``GraphCompileReason``
per graph break, with the user's stack where dynamo broke the graph).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

from nndoctor.core.findings import Location
from nndoctor.core.user_code import display_path, is_user_path

# "2/3: lr == 0.025     # return model(x)*lr  # train.py:16 in scaled\nUser stack trace: ..."
_ENTRY = re.compile(r"^\s*\d+/(\d+): (.*)$")
_STACK_LINE = re.compile(r'File "([^"]+)", line (\d+)')


@dataclass(frozen=True)
class Recompilation:
    """One compiled function that recompiled: how often, the last guard that failed and where."""

    function: str
    definition: Location
    recompiles: int
    last_reason: str
    reason_location: Location | None  # the user line that read the guarded value, when dynamo names it


@dataclass(frozen=True)
class GraphBreak:
    reason: str
    location: Location | None  # the innermost user frame where dynamo broke the graph


def _dynamo_utils() -> Any:
    return sys.modules.get("torch._dynamo.utils")


def _code_key(code: Any) -> tuple[str, int, str]:
    return (code.co_filename, code.co_firstlineno, code.co_name)


def guard_failure_counts() -> dict[tuple[str, int, str], int]:
    """How many guard-failure entries each compiled function has now (the run's baseline)."""
    failures = getattr(_dynamo_utils(), "guard_failures", None) or {}
    return {_code_key(code): len(entries) for code, entries in list(failures.items())}


def graph_break_count() -> int:
    return len(getattr(_dynamo_utils(), "graph_break_reasons", None) or [])


def split_recompilations(entries: list[str]) -> list[list[str]]:
    """Guard-failure entries grouped by recompilation: each recompilation lists the failed guard
    of every cache entry, newest first, ending with cache entry 0."""
    groups: list[list[str]] = []
    current: list[str] = []
    for entry in entries:
        current.append(entry)
        match = _ENTRY.match(entry.splitlines()[0] if entry else "")
        if match and match.group(1) == "0":
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def guard_text(entry: str) -> str:
    """The failed guard alone: no compile id, no source comment, no stack."""
    first = entry.splitlines()[0] if entry else ""
    match = _ENTRY.match(first)
    text = match.group(2) if match else first
    return text.split("  #", 1)[0].strip()


def guard_user_location(entry: str) -> Location | None:
    for path, line in reversed(_STACK_LINE.findall(entry)):
        if is_user_path(path):
            return Location(display_path(path), int(line))
    return None


def recompilations_since(baseline: dict[tuple[str, int, str], int]) -> list[Recompilation]:
    """Compiled functions that recompiled since ``baseline``, most recompilations first."""
    failures = getattr(_dynamo_utils(), "guard_failures", None) or {}
    found = []
    for code, entries in list(failures.items()):
        new = list(entries)[baseline.get(_code_key(code), 0):]
        groups = split_recompilations(new)
        if not groups:
            continue
        last = groups[-1][0]  # the newest cache entry's failed guard in the last recompilation
        found.append(Recompilation(
            function=code.co_name,
            definition=Location(display_path(code.co_filename), code.co_firstlineno),
            recompiles=len(groups),
            last_reason=guard_text(last),
            reason_location=guard_user_location(last),
        ))
    return sorted(found, key=lambda r: -r.recompiles)


def _break_location(user_stack: Any) -> Location | None:
    for frame in reversed(list(user_stack or [])):
        filename = getattr(frame, "filename", "")
        if is_user_path(filename):
            return Location(display_path(filename), getattr(frame, "lineno", None))
    return None


def break_reason(text: str) -> str:
    """Dynamo's reason, first line and its explanation (the first line alone can be as vague as
    "Failed to trace builtin operator"), without the hints and links."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "unknown"
    explanation = next((line[len("Explanation:"):].strip() for line in lines[1:]
                        if line.startswith("Explanation:")), "")
    reason = f"{lines[0]}: {explanation}" if explanation else lines[0]
    return reason if len(reason) <= 240 else reason[:237] + "..."


def graph_breaks_since(start: int) -> list[tuple[GraphBreak, int]]:
    """Graph breaks since the ``start``-th record, grouped by (reason, user line), most frequent first."""
    reasons = list(getattr(_dynamo_utils(), "graph_break_reasons", None) or [])[start:]
    counted: Counter[GraphBreak] = Counter()
    for record in reasons:
        text = str(getattr(record, "reason", "") or "").strip()
        counted[GraphBreak(break_reason(text),
                           _break_location(getattr(record, "user_stack", None)))] += 1
    return counted.most_common()
