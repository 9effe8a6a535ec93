"""The steps an existing TensorBoard event file holds, per tag (R103's shared-directory case).

An event file is a TFRecord stream (uint64 length, uint32 length CRC, the bytes, uint32 data
CRC) of ``Event`` protos: ``step`` is field 2, ``summary`` field 5, whose values (field 1)
carry their ``tag`` as field 1. Only those fields are decoded; reading stops at a truncated
record (a writer still appending) and after ``MAX_BYTES``.
"""

from __future__ import annotations

import struct

from nndoctor.util.protowire import fields, signed64

MAX_BYTES = 64 << 20


def _event_tags_and_step(event: bytes) -> tuple[list[str], int]:
    step = 0
    tags: list[str] = []
    for number, value in fields(event):
        if number == 2 and isinstance(value, int):
            step = signed64(value)
        elif number == 5 and isinstance(value, bytes):
            for summary_field, summary_value in fields(value):
                if summary_field == 1 and isinstance(summary_value, bytes):
                    for value_field, tag in fields(summary_value):
                        if value_field == 1 and isinstance(tag, bytes):
                            tags.append(tag.decode("utf-8", "replace"))
    return tags, step


def steps_by_tag(path: str) -> dict[str, tuple[int, int]]:
    """tag -> (first, last) step of the summaries in the event file at ``path`` ({} if unreadable)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES)
    except OSError:
        return {}
    found: dict[str, tuple[int, int]] = {}
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        start = pos + 12
        if start + length + 4 > len(data):
            break
        try:
            tags, step = _event_tags_and_step(data[start:start + length])
        except ValueError:
            break
        for tag in tags:
            first, last = found.get(tag, (step, step))
            found[tag] = (min(first, step), max(last, step))
        pos = start + length + 4
    return found
