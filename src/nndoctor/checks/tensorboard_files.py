"""The steps an existing TensorBoard event file holds, per tag (R103's shared-directory case).

An event file is a TFRecord stream (uint64 length, uint32 length CRC, the bytes, uint32 data
CRC) of ``Event`` protos: ``step`` is field 2, ``summary`` field 5, whose values (field 1)
carry their ``tag`` as field 1. Only those fields are decoded; reading stops at a truncated
record (a writer still appending) and after ``MAX_BYTES``.
"""

from __future__ import annotations

import struct

MAX_BYTES = 64 << 20


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while pos < len(data) and shift < 70:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise ValueError("bad varint")


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        wire = key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            out.append((key >> 3, value))
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(data, pos)
            out.append((key >> 3, data[pos:pos + length]))
            pos += length
        else:
            raise ValueError("bad wire type")
    return out


def _event_tags_and_step(event: bytes) -> tuple[list[str], int]:
    step = 0
    tags: list[str] = []
    for number, value in _fields(event):
        if number == 2 and isinstance(value, int):
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 5 and isinstance(value, bytes):
            for summary_field, summary_value in _fields(value):
                if summary_field == 1 and isinstance(summary_value, bytes):
                    for value_field, tag in _fields(summary_value):
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
