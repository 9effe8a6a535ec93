"""Decompressing one Snappy block (the raw format, no framing), in pure Python.

TensorFlow 1.x wrote the blocks of a checkpoint's ``.index`` table Snappy-compressed (LevelDB's
default table option), so SavedModels exported then (TF Serving's own test models among them)
need it. Index blocks are a few kB, so speed does not matter; the input may be hostile, so
every length and offset is checked before it is used and the output size is bounded.

Format (github.com/google/snappy, format_description.txt): a varint of the uncompressed
length, then elements whose tag byte's low two bits say literal (00) or a copy of earlier
output with a 1-, 2- or 4-byte offset (01, 10, 11).
"""

from __future__ import annotations

from nndoctor.util.protowire import ProtoError, read_varint


class SnappyError(ValueError):
    """The block is not valid Snappy data."""


def decompress(data: bytes, max_size: int) -> bytes:
    """The uncompressed bytes of ``data``; SnappyError if invalid or larger than ``max_size``."""
    try:
        size, pos = read_varint(data, 0)
    except ProtoError as error:
        raise SnappyError(f"bad uncompressed-length varint ({error})") from None
    if size > max_size:
        raise SnappyError(f"declares {size} uncompressed bytes (more than {max_size})")
    out = bytearray()
    end = len(data)
    while pos < end:
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal
            length = tag >> 2
            if length >= 60:
                extra = length - 59
                if pos + extra > end:
                    raise SnappyError("literal length runs past the end")
                length = int.from_bytes(data[pos:pos + extra], "little")
                pos += extra
            length += 1
            if pos + length > end:
                raise SnappyError("literal runs past the end")
            out += data[pos:pos + length]
            pos += length
        else:
            if kind == 1:
                if pos + 1 > end:
                    raise SnappyError("copy runs past the end")
                length = 4 + ((tag >> 2) & 7)
                offset = ((tag >> 5) << 8) | data[pos]
                pos += 1
            else:
                width = 2 if kind == 2 else 4
                if pos + width > end:
                    raise SnappyError("copy runs past the end")
                length = 1 + (tag >> 2)
                offset = int.from_bytes(data[pos:pos + width], "little")
                pos += width
            if offset == 0 or offset > len(out):
                raise SnappyError(f"copy offset {offset} outside the {len(out)} bytes written")
            start = len(out) - offset
            if offset >= length:
                out += out[start:start + length]
            else:  # an overlapping copy repeats the last `offset` bytes
                for i in range(length):
                    out.append(out[start + i])
        if len(out) > size:
            raise SnappyError(f"more output than the declared {size} bytes")
    if len(out) != size:
        raise SnappyError(f"{len(out)} bytes of output, {size} declared")
    return bytes(out)
