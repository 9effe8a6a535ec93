"""A minimal reader of the protocol-buffer wire format, for the few TensorFlow messages nndoctor
reads: ``nndoctor ckpt``'s BundleHeaderProto, BundleEntryProto and TrackableObjectGraph, and
``nndoctor data``'s tf.train.Example varints.

TensorFlow's generated classes would need TensorFlow (or its protobuf definitions) installed;
the wire format is small and stable, so it is decoded here. Input comes from untrusted files:
every length is checked against the bytes left, and a malformed message raises ProtoError.
"""

from __future__ import annotations

from collections.abc import Iterator


class ProtoError(ValueError):
    """The bytes are not a well-formed protocol-buffer message."""


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the base-128 varint at ``pos``."""
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise ProtoError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtoError("varint longer than 10 bytes")


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) pairs: an int for varint/fixed fields, bytes for length-delimited ones."""
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(data, pos)
            yield number, value
        elif wire == 1:
            if pos + 8 > len(data):
                raise ProtoError("truncated fixed64")
            yield number, int.from_bytes(data[pos:pos + 8], "little")
            pos += 8
        elif wire == 2:
            length, pos = read_varint(data, pos)
            if pos + length > len(data):
                raise ProtoError("length-delimited field runs past the message")
            yield number, data[pos:pos + length]
            pos += length
        elif wire == 5:
            if pos + 4 > len(data):
                raise ProtoError("truncated fixed32")
            yield number, int.from_bytes(data[pos:pos + 4], "little")
            pos += 4
        else:
            raise ProtoError(f"unsupported wire type {wire}")


def as_bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise ProtoError("expected a length-delimited field")
    return value


def as_int(value: int | bytes) -> int:
    if isinstance(value, bytes):
        raise ProtoError("expected a numeric field")
    return value


def signed64(value: int) -> int:
    """A varint read as int64 (negative numbers are 10-byte two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value
