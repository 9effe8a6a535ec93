"""Reading Python tracebacks out of text: a pasted traceback or a whole training log.

A log may hold several tracebacks (several ranks, or retries); chained tracebacks
("During handling of the above exception …", "The above exception was the direct cause …")
belong to one crash. Each crash becomes a ``Crash`` whose ``frames`` are the traceback's
entries and whose ``preamble`` keeps the lines printed just before it (a CUDA kernel's
assertion, argparse's usage line), which some explanations need.
"""

from __future__ import annotations

import re

from nndoctor.explain.crash import Crash, Frame

_TRACEBACK_START = re.compile(r"^(?P<indent>[ \t]*)Traceback \(most recent call last\):[ \t]*$", re.M)
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?\s*$')
_EXCEPTION_LINE = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Fault))(?::[ \t]?(?P<msg>.*))?$"
)
_CHAIN_MARKERS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_PREAMBLE_LINES = 40
# How much of the previous traceback of a chain a chained traceback keeps as its preamble. Not
# the whole chain: each link would then copy all the links before it, and a log of n chained
# tracebacks would cost n² time and memory (minutes for a few MB).
_CHAIN_CONTEXT_CHARS = 4096
# torchrun prefixes every line of a rank's output ("[rank1]: Traceback ...").
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d*\]:[ ]?", re.M)


def parse_frames(lines: list[str]) -> tuple[list[Frame], int]:
    """Frames from traceback lines (after the header); returns them and the index after them."""
    frames: list[Frame] = []
    i = 0
    while i < len(lines):
        match = _FRAME.match(lines[i])
        if not match:
            stripped = lines[i].strip()
            # Source lines, caret markers and "[Previous line repeated N more times]".
            if frames and (lines[i].startswith("    ") or stripped.startswith("[Previous line")):
                i += 1
                continue
            break
        source = ""
        if i + 1 < len(lines) and lines[i + 1].startswith("    ") and not _FRAME.match(lines[i + 1]):
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


def _parse_block(block: str, preamble: str) -> Crash | None:
    lines = block.splitlines()
    header = next((i for i, line in enumerate(lines) if _TRACEBACK_START.match(line)), None)
    if header is None:
        return None
    indent = len(_TRACEBACK_START.match(lines[header]).group("indent"))
    body = [line[indent:] if line[:indent].strip() == "" else line for line in lines[header + 1:]]
    frames, end = parse_frames(body)
    rest = body[end:]
    # The exception line is the first line (at column 0) that looks like "Type: message".
    for j, line in enumerate(rest):
        match = _EXCEPTION_LINE.match(line.rstrip())
        if match and not line.startswith(" "):
            message_lines = [match.group("msg") or ""] + [m.rstrip("\n") for m in rest[j + 1:]]
            message = "\n".join(message_lines).rstrip()
            crash = Crash(exc_type=match.group("type"), message=message, frames=frames, preamble=preamble)
            crash.worker_frames = worker_traceback_frames(message)
            return crash
    return None


def parse_crashes(text: str) -> list[list[Crash]]:
    """Every crash in ``text``: a list of chains, each chain's tracebacks in order (last = raised)."""
    text = _RANK_PREFIX.sub("", text.replace("\r\n", "\n"))
    starts = [m.start() for m in _TRACEBACK_START.finditer(text)]
    if not starts:
        single = bare_error(text)
        return [[single]] if single else []
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
    return chains


def bare_error(text: str) -> Crash | None:
    """A lone error line without a traceback ("RuntimeError: CUDA out of memory ...")."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = _EXCEPTION_LINE.match(line.strip())
        if match and match.group("msg") is not None:
            message = "\n".join([match.group("msg")] + lines[i + 1:]).rstrip()
            return Crash(exc_type=match.group("type"), message=message,
                         preamble="\n".join(lines[max(0, i - _PREAMBLE_LINES):i]))
    return None
