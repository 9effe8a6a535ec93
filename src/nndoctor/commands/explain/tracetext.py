"""Reading Python tracebacks out of text: a pasted traceback or a whole training log.

A log may hold several tracebacks (several ranks, or retries); chained tracebacks
("During handling of the above exception …", "The above exception was the direct cause …")
belong to one crash. Each crash becomes a ``Crash`` whose ``frames`` are the traceback's
entries and whose ``preamble`` keeps the lines printed just before it (a CUDA kernel's
assertion, argparse's usage line), which some explanations need.
"""

from __future__ import annotations

import re

from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.frames import (
    FRAME_LINE,
    Frame,
    parse_frames,
    worker_traceback_frames,
)
from nndoctor.commands.explain.pasted import clean, cpp_terminate, find_error_line
from nndoctor.commands.explain.wordings import (
    KNOWN_MESSAGE_START,
    KNOWN_TF_MESSAGE,
    current_wording,
)

_TRACEBACK_START = re.compile(r"^(?P<indent>[ \t]*)Traceback \(most recent call last\):[ \t]*$", re.M)
# After a traceback's frames the exception line may also name a class outside the usual
# suffixes when its module is given ("torch._dynamo.exc.BackendCompilerFailed: …",
# "torch._dynamo.exc.FailOnRecompileLimitHit: …"): Python prints the module for any class not in builtins.
_EXCEPTION_LINE = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Fault)"
    r"|(?:[A-Za-z_]\w*\.)+[A-Z][A-Za-z0-9]*)(?::[ \t]?(?P<msg>.*))?$"
)
_CHAIN_MARKERS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_PREAMBLE_LINES = 40
# Lines after an exception's first line kept as its message (a DataLoader worker's message
# holds the worker's whole traceback; NCCL's, a few lines of state).
_MESSAGE_LINES = 300
# Python 3.11+ marks the failing expression under a frame's source line.
_CARETS = re.compile(r"^\s*[~^]+\s*$")
# How far above a bare error line frames of a traceback whose header was lost are looked for.
_HEADERLESS_FRAME_LINES = 400
# pytest's summary of where a test failed, printed under its "E   " lines: "pkg/mod.py:178: RuntimeError".
_PYTEST_LOCATION = re.compile(r"^(?P<path>\S+\.py):(?P<line>\d+): (?P<type>[\w.]+)\s*$")
# How much of the previous traceback of a chain a chained traceback keeps as its preamble. Not
# the whole chain: each link would then copy all the links before it, and a log of n chained
# tracebacks would cost n² time and memory (minutes for a few MB).
_CHAIN_CONTEXT_CHARS = 4096


def _parse_block(block: str, preamble: str) -> Crash | None:
    lines = block.splitlines()
    header, start = next(((i, m) for i, line in enumerate(lines) if (m := _TRACEBACK_START.match(line))),
                         (None, None))
    if header is None or start is None:
        return None
    indent = len(start.group("indent"))
    body = [line[indent:] if line[:indent].strip() == "" else line for line in lines[header + 1:]]
    frames, end = parse_frames(body)
    rest = body[end:]
    # The exception line is the first line (at column 0) that looks like "Type: message".
    for j, line in enumerate(rest):
        match = _EXCEPTION_LINE.match(line.rstrip())
        if match and not line.startswith(" "):
            # The message runs to the next traceback, but a log's lines after the last one are
            # not part of it: keep a message's worth (the patterns read its start), so a long
            # log's tail is not searched once per pattern.
            message_lines = [match.group("msg") or ""] + [m.rstrip("\n") for m in rest[j + 1:j + 1 + _MESSAGE_LINES]]
            message = "\n".join(message_lines).rstrip()
            crash = Crash(exc_type=match.group("type"), message=message, frames=frames, preamble=preamble)
            crash.worker_frames = worker_traceback_frames(message)
            return crash
    return None


def parse_crashes(text: str) -> list[list[Crash]]:
    """Every crash in ``text``: a list of chains, each chain's tracebacks in order (last = raised).

    The text is first cleaned of what pasting adds (``pasted.clean``). When no traceback can
    be read to its end (none in the text, or each one cut off), the text's error line is used.
    """
    return parse_clean(clean(text))


def parse_clean(text: str) -> list[list[Crash]]:
    """``parse_crashes`` of a text already cleaned with ``pasted.clean``."""
    starts = [m.start() for m in _TRACEBACK_START.finditer(text)]
    if not starts:
        single = bare_error(text)
        return _with_current_wording([[single]] if single else [])
    chains: list[list[Crash]] = []
    previous_end = 0
    for index, start in enumerate(starts):
        end = starts[index + 1] if index + 1 < len(starts) else len(text)
        block = text[start:end]
        between = text[previous_end:start]
        preamble = "\n".join(between.splitlines()[-_PREAMBLE_LINES:])
        chained = index > 0 and any(marker in between for marker in _CHAIN_MARKERS)
        for marker in _CHAIN_MARKERS:
            block = block.split(marker)[0]
        crash = _parse_block(block, preamble)
        previous_end = start + len(block)
        if crash is None:
            continue
        if chained and chains:
            cause = chains[-1][-1].text[-_CHAIN_CONTEXT_CHARS:]
            crash.preamble = f"{cause}\n{crash.preamble}"
            chains[-1].append(crash)
        else:
            chains.append([crash])
    if not chains:  # every traceback was cut off before its exception line
        single = bare_error(text)
        chains = [[single]] if single else []
    return _with_current_wording(chains)


def _with_current_wording(chains: list[list[Crash]]) -> list[list[Crash]]:
    for chain in chains:
        for crash in chain:
            _add_current_wording(crash)
    return chains


def _add_current_wording(crash: Crash) -> None:
    """Put today's wording of an old-style message right under the message's first line, where
    the explanations read it (their facts: devices, dtypes); the first line, which reports show,
    stays what the log said."""
    modern = current_wording(crash.message)
    if modern:
        first, _, rest = crash.message.partition("\n")
        crash.message = "\n".join([first, *modern, *([rest] if rest else [])])


def bare_error(text: str) -> Crash | None:
    """The error of a text without a complete traceback: an exception named in a line
    ("RuntimeError: CUDA out of memory ...", also after other text on that line), libtorch's
    C++ ``terminate``/``what()`` lines, or else a known PyTorch message pasted without its
    exception's name. Frames printed right above the error line (a traceback whose header was
    not copied) are kept."""
    lines = text.splitlines()
    typed = next(((i, m) for i, line in enumerate(lines) if (m := find_error_line(line))), None)
    native = cpp_terminate(lines[:typed[0]] if typed else lines)
    if native is not None:
        i, exc_type, what = native
        message = "\n".join([what] + [line for line in lines[i + 1:i + 1 + _MESSAGE_LINES] if not line.lstrip().startswith("what():")])
        return Crash(exc_type=exc_type, message=message.rstrip(), preamble=_preamble(lines, i))
    if typed is not None:
        i, match = typed
        message = "\n".join([match.group("msg")] + lines[i + 1:i + 1 + _MESSAGE_LINES]).rstrip()
        frames = _frames_above(lines, i) if not lines[i][:match.start()].strip() else []
        frames = frames or _pytest_location(lines, i, match.group("type"))
        crash = Crash(exc_type=match.group("type"), message=message, frames=frames, preamble=_preamble(lines, i))
        crash.worker_frames = worker_traceback_frames(message)
        return crash
    for i, line in enumerate(lines):
        tf_message = KNOWN_TF_MESSAGE.search(line)
        if KNOWN_MESSAGE_START.match(line) or tf_message:
            # TensorFlow's log lines carry a logging prefix before the message: keep from the message on.
            start = line.rfind("] ", 0, tf_message.start()) + 2 if tf_message and "] " in line[:tf_message.start()] else 0
            message = "\n".join([line[start:].strip()] + lines[i + 1:i + 1 + _MESSAGE_LINES]).rstrip()
            # The exception's name was not pasted; "Error" stands for it in the report.
            return Crash(exc_type="Error", message=message, frames=_frames_below(lines, i),
                         preamble=_preamble(lines, i))
    return _native_error(lines)


# Errors that native code reports in words of its own, with no exception name: c10d's NCCL
# watchdog ("[Rank 0] NCCL watchdog thread terminated with exception: CUDA error: …",
# ProcessGroupNCCL.cpp), its asynchronous error handling ("Collective WorkNCCL(…) raised the
# following async exception: NCCL error: …"), and CPython's fatal-error handler, in that order
# of preference (the interpreter's "Fatal Python error: Aborted" only says the process aborted).
_NATIVE_ERRORS = (
    re.compile(r"(?:thread|Watchdog) terminated with exception: (?P<msg>\S.*)$"),
    re.compile(r"raised the following async exception: (?P<msg>\S.*)$"),
    re.compile(r"^Fatal Python error: (?P<msg>\S.*)$"),
)


def _native_error(lines: list[str]) -> Crash | None:
    for pattern in _NATIVE_ERRORS:
        for i, line in enumerate(lines):
            found = pattern.search(line) if "rror" in line or "xception" in line else None
            if found:
                message = "\n".join([found.group("msg"), *lines[i + 1:i + 1 + _MESSAGE_LINES]]).rstrip()
                return Crash(exc_type="Error", message=message, preamble=_preamble(lines, i))
    return None


def _preamble(lines: list[str], index: int) -> str:
    return "\n".join(lines[max(0, index - _PREAMBLE_LINES):index])


def _frames_above(lines: list[str], index: int) -> list[Frame]:
    """Frames printed just above ``lines[index]`` (a traceback pasted without its header, its
    lines possibly flush-left): each ``File "…", line N`` with the source line under it."""
    top = index
    while top > 0 and index - top < _HEADERLESS_FRAME_LINES:
        above = lines[top - 1]
        if FRAME_LINE.match(above) or _CARETS.match(above) or (top >= 2 and FRAME_LINE.match(lines[top - 2])):
            top -= 1
        else:
            break
    return _loose_frames(lines[top:index])


def _pytest_location(lines: list[str], index: int, exc_type: str) -> list[Frame]:
    """The frame pytest names under a failure's ``E`` lines ("bliss/catalog.py:178: RuntimeError")."""
    short = exc_type.rsplit(".", 1)[-1]
    for line in lines[index + 1:index + 40]:
        found = _PYTEST_LOCATION.match(line)
        if found and found.group("type").rsplit(".", 1)[-1] == short:
            return [Frame(found.group("path"), int(found.group("line")))]
    return []


def _frames_below(lines: list[str], index: int) -> list[Frame]:
    """Frames of a traceback printed below a message line (its last line may be cut off)."""
    below = lines[index + 1:index + 1 + _HEADERLESS_FRAME_LINES]
    start = next((j for j, line in enumerate(below) if _TRACEBACK_START.match(line)), None)
    return _loose_frames(below[start + 1:]) if start is not None else []


def _loose_frames(block: list[str]) -> list[Frame]:
    frames = []
    for j, line in enumerate(block):
        match = FRAME_LINE.match(line)
        if not match:
            continue
        source = ""
        if j + 1 < len(block) and not FRAME_LINE.match(block[j + 1]) and not _CARETS.match(block[j + 1]):
            source = block[j + 1].strip()
        frames.append(Frame(match.group("path"), int(match.group("line")), (match.group("func") or "").strip(), source))
    return frames
