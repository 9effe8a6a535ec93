"""Undoing what pasting does to a log: line prefixes and markdown around tracebacks.

Users paste errors into issue trackers and chats with decorations that hide the traceback
from a strict parser: torchrun's ``[rank0]:`` and Ray's ``(RayExecutor pid=12)`` on every
line, logger timestamps, markdown quotes (``> ``), code fences and backticks on the error
line, ``**bold**`` around it, typographic quotes, pytest's ``E   `` prefix. ``clean`` removes
those, line by line and in linear time, so the traceback reader sees what Python printed.

The other half of pasting is text around the error: "the error occurred: RuntimeError: …".
``find_error_line`` finds an exception named anywhere in a line, and ``cpp_terminate`` reads
the ``terminate called after throwing an instance of 'c10::Error'`` / ``what():`` pair that
libtorch prints when an error escapes C++ code with no Python frame to catch it.
"""

from __future__ import annotations

import re

# Prefixes that launchers and loggers put before every line a process prints.
_LINE_PREFIXES = (
    re.compile(r"^\[(?:rank|default)\d*\]:[ ]?"),  # torchrun / accelerate: "[rank1]: "
    re.compile(r"^\((?:[\w.]+ )?pid=\d+(?:, ip=[\d.]+)?\)[ ]?"),  # Ray: "(RayExecutor pid=12) "
    re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:"),  # mpirun --tag-output (Horovod): "[1,0]<stderr>:"
    # ISO timestamps, optionally bracketed, optionally followed by a logging level.
    re.compile(r"^\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?"
               r"(?:[ \t]*[|:-]?[ \t]*\[?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]?)?"
               r"(?:[ \t]*[|:-])?[ ]?"),
    re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]*:"),  # logging.basicConfig: "ERROR:root:"
    re.compile(r"^(?:>[ ]?)+"),  # markdown block quotes, nested ("> > ")
    re.compile(r"^E(?: {2,}|\t)"),  # pytest's failure lines: "E       RuntimeError: ..."
    # glog, as c10 and TensorFlow's C++ print it: "E1127 12:00:01.123456 4242 ProcessGroupNCCL.cpp:607] ",
    # bracketed by PyTorch ("[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] ", "[W socket.cpp:426] ").
    re.compile(r"^\[?[IWEF]\d{4} \d{2}:\d{2}:\d{2}(?:\.\d+)?(?: +\d+)? [\w./<>-]+:\d+\][ ]?"),
    re.compile(r"^\[[IWEF] [\w./<>-]+:\d+\][ ]?"),
)
# One pattern for all prefixes, tried only on lines starting with one of their first characters.
_ANY_PREFIX = re.compile("|".join(f"(?:{p.pattern})" for p in _LINE_PREFIXES))
_PREFIX_STARTS = frozenset("[(0123456789DIWECF>")
_DECORATION_STARTS = frozenset("`~*\"'“”‘’")
_FENCE = re.compile(r"^\s*(?:```|~~~)[\w+-]*\s*$|^\s*`\s*$")
# Quotes are only taken off when an exception name follows them (source lines keep theirs).
_LEADING_DECORATION = re.compile(
    r"^(?P<indent>\s*)(?:```|`|\*\*|[\"'“”‘’](?=(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)))(?=\S)")
_TRAILING_DECORATION = re.compile(r"(?:```|`|\*\*|[\"'“”‘’])\s*$")

# An exception named in a line: "RuntimeError: …", "torch.OutOfMemoryError: …". The last dotted
# component starts with a capital, which keeps "self.error: x" and file names out.
# Exceptions whose names have none of the usual suffixes are listed by name: torch.compile's.
_OTHER_EXCEPTION_NAMES = r"BackendCompilerFailed|FailOnRecompileLimitHit|RecompileLimitExceeded"
EXCEPTION_IN_LINE = re.compile(
    r"(?<![\w.])(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Fault)"
    # TensorFlow 1's session errors: "InvalidArgumentError (see above for traceback): …".
    rf"|{_OTHER_EXCEPTION_NAMES}))(?: \(see above for traceback\))?:[ \t]?(?P<msg>\S.*)$"
)
_TERMINATE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")
_WHAT = re.compile(r"^\s*what\(\):\s*(?P<msg>.*)$")


def clean_line(line: str) -> str:
    """One line without launcher/logger/markdown prefixes and decorations around it."""
    for _ in range(4):  # prefixes nest ("> [rank0]: E   ..."); a few passes undo them
        prefix = _ANY_PREFIX.match(line) if line[:1] in _PREFIX_STARTS else None
        if prefix is None:
            break
        line = line[prefix.end():]
    first = line.lstrip()[:1]
    if not first or first not in _DECORATION_STARTS:
        return line  # the common case: nothing to undo
    if _FENCE.match(line):
        return ""
    lead = _LEADING_DECORATION.match(line)
    if lead:
        marker = line[len(lead.group("indent")):lead.end()]
        line = lead.group("indent") + line[lead.end():]
        if marker == "**":
            # Bold from the start of a line: drop its closing marker too (the line's end, or
            # the first one when more text follows: "**RuntimeError: x**. More text").
            stripped = line.rstrip()
            line = stripped[:-2] if stripped.endswith("**") else line.replace("**", "", 1)
        else:
            line = _TRAILING_DECORATION.sub("", line)
    return line


def clean(text: str) -> str:
    """``text`` with every line cleaned (see ``clean_line``); line count unchanged."""
    return "\n".join(clean_line(line) for line in text.replace("\r\n", "\n").split("\n"))


# An exception whose message starts on the next line ("…errors.ChildFailedError: " above
# torchrun's failure table): only a line holding nothing else counts, not prose ending in "Error:".
_EXCEPTION_ALONE = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)+[A-Z]\w*(?:Error|Exception)|[A-Z]\w*(?:Error|Exception)):[ \t]*(?P<msg>)$")


def find_error_line(line: str) -> re.Match[str] | None:
    """The exception named in ``line``, at its start or after other text. Warnings do not
    count: a warning printed in a log is not what stopped the run."""
    return EXCEPTION_IN_LINE.search(line) or _EXCEPTION_ALONE.match(line)


def cpp_terminate(lines: list[str]) -> tuple[int, str, str] | None:
    """(line index, C++ type, message) for libtorch's "terminate called after throwing an
    instance of 'c10::Error'" followed by its ``what():`` line, or None."""
    for i, line in enumerate(lines):
        found = _TERMINATE.search(line)
        if not found:
            continue
        for j in range(i + 1, min(i + 4, len(lines))):
            what = _WHAT.match(lines[j])
            if what:
                return i, found.group("type"), what.group("msg").strip()
    return None
