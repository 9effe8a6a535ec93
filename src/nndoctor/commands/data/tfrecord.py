"""Read one TFRecord file: verify its framing, parse each tf.train.Example, decode its images.

A TFRecord record is ``uint64 length | uint32 masked_crc32c(length) | data | uint32
masked_crc32c(data)``, little-endian. The ``tfrecord`` PyPI reader skips both CRCs, so they
are checked here. Examples are parsed with a minimal protobuf decoder (no TensorFlow needed).
The per-file result is a plain, JSON-serialisable summary that the analysis merges.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import zlib
from collections.abc import Iterator
from typing import IO, Any, cast

from PIL import Image

from nndoctor.commands.data.crc32c import masked_crc32c
from nndoctor.commands.data.formats import IMAGE_FORMATS, sniff
from nndoctor.commands.data.storage import open_input
from nndoctor.util.limits import ReadLimits, megabytes
from nndoctor.util.protowire import ProtoError, read_varint

TFRECORD_VERSION = 2
# Examples kept per (file, signature) and per (file, key, length) so that a minority of odd
# records can be named without holding an entry per record (bounded memory).
EXAMPLES_KEPT = 20
# Problems kept per file (a wholly broken file would otherwise list every record).
PROBLEMS_KEPT = 1000
_MAX_RECORD = 1 << 31  # a length above 2 GiB is a corrupt length field, not a record


class NotAnExample(ValueError):
    """The record's bytes do not parse as a tf.train.Example."""


# -- framing -------------------------------------------------------------------------------
def open_records(path: str) -> tuple[IO[bytes], str]:
    """Open a TFRecord file, transparently decompressing GZIP or ZLIB files."""
    raw = open_input(path)
    head = raw.read(2)
    raw.seek(0)
    if head == b"\x1f\x8b":
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw)), "gzip"  # a binary file; not an IO subclass in the stubs
    if len(head) == 2 and head[0] == 0x78 and (head[0] * 256 + head[1]) % 31 == 0 and _zlib_plausible(raw):
        raw.seek(0)
        return cast(IO[bytes], _ZlibReader(raw)), "zlib"
    raw.seek(0)
    return raw, "none"


def _zlib_plausible(raw: IO[bytes]) -> bool:
    # A plain record whose length happens to start with 0x78 must not be taken for zlib:
    # trust zlib only when the plain reading's length CRC fails.
    header = raw.read(12)
    if len(header) < 12:
        return True
    return struct.unpack("<I", header[8:12])[0] != masked_crc32c(header[:8])


class _ZlibReader(io.RawIOBase):
    def __init__(self, raw: IO[bytes]) -> None:
        self._raw, self._inflater, self._buffer = raw, zlib.decompressobj(), b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = self._raw.read(1 << 16)
            if not chunk:
                if not self._inflater.eof:
                    raise EOFError("ZLIB stream ended before its end marker")
                break
            self._buffer += self._inflater.decompress(chunk)
        out, self._buffer = (self._buffer, b"") if size < 0 else (self._buffer[:size], self._buffer[size:])
        return out

    def close(self) -> None:
        self._raw.close()
        super().close()


def iter_records(stream: IO[bytes], max_record: int | None = None,
                 ) -> Iterator[tuple[int, int, bytes | None, str | None]]:
    """Yield ``(index, offset, data, problem)``; after a framing problem that makes the rest
    of the file unreadable, the last item has ``data=None`` and the reading stops.

    A record longer than ``max_record`` bytes is not read (it would be held in memory whole,
    and in a gzip file 1.5 MB on disk can declare 1.5 GB): reported, and the reading stops.
    """
    max_record = ReadLimits.from_env().max_record_bytes if max_record is None else max_record
    offset, index = 0, 0
    while True:
        header = stream.read(12)
        if not header:
            return
        if len(header) < 12:
            yield index, offset, None, f"truncated: {len(header)}-byte partial header at the end"
            return
        length_bytes, (length_crc,) = header[:8], struct.unpack("<I", header[8:])
        if masked_crc32c(length_bytes) != length_crc:
            yield index, offset, None, "length CRC mismatch: the record length is corrupt, rest of file unreadable"
            return
        (length,) = struct.unpack("<Q", length_bytes)
        if length > _MAX_RECORD:
            yield index, offset, None, f"record length {length} is implausible; rest of file unreadable"
            return
        if length > max_record:
            yield index, offset, None, (f"record declares {megabytes(length)}, over the "
                                        f"{megabytes(max_record)} read limit (NNDOCTOR_MAX_RECORD_MB): "
                                        f"not read, nor the rest of the file")
            return
        data = stream.read(length)
        footer = stream.read(4)
        if len(data) < length or len(footer) < 4:
            got = len(data) + len(footer)
            yield index, offset, None, f"truncated: record needs {length + 4} more bytes, {got} left"
            return
        (data_crc,) = struct.unpack("<I", footer)
        problem = None if masked_crc32c(data) == data_crc else "data CRC mismatch: record bytes are corrupt"
        yield index, offset, data, problem
        offset += 16 + length
        index += 1


# -- tf.train.Example ----------------------------------------------------------------------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    try:
        return read_varint(buf, pos)
    except ProtoError as error:
        raise NotAnExample(str(error)) from None


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """Yield (field number, wire type, value) of one protobuf message."""
    pos, end = 0, len(buf)
    value: Any  # an int (varint) or bytes, by wire type
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > end:
                raise NotAnExample("length-delimited field runs past the end")
            value, pos = buf[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise NotAnExample(f"unsupported wire type {wire}")
        if pos > end:
            raise NotAnExample("field runs past the end")
        yield number, wire, value


_KINDS = {1: "bytes", 2: "float", 3: "int64"}


def parse_example(buf: bytes) -> dict[str, tuple[str, int, list[bytes]]]:
    """``{key: (type, number of values, bytes values)}`` of one serialized tf.train.Example."""
    features: dict[str, tuple[str, int, list[bytes]]] = {}
    for number, wire, features_msg in _fields(buf):
        if number != 1 or wire != 2:
            continue
        for entry_number, entry_wire, entry in _fields(features_msg):
            if entry_number != 1 or entry_wire != 2:
                continue
            key, feature = None, b""
            for n, w, v in _fields(entry):
                if n == 1 and w == 2:
                    key = bytes(v).decode("utf-8", "backslashreplace")
                elif n == 2 and w == 2:
                    feature = v
            if key is None:
                raise NotAnExample("feature map entry without a key")
            features[key] = _parse_feature(feature)
    return features


def _parse_feature(buf: bytes) -> tuple[str, int, list[bytes]]:
    kind, count, values = "none", 0, []
    for number, wire, value_list in _fields(buf):
        if wire != 2 or number not in _KINDS:
            continue
        kind = _KINDS[number]
        for n, w, v in _fields(value_list):
            if n != 1:
                continue
            if kind == "bytes":
                values.append(v)
                count += 1
            elif kind == "float":
                count += len(v) // 4 if w == 2 else 1
            elif w == 2:  # packed int64 varints
                pos = 0
                while pos < len(v):
                    _, pos = _varint(v, pos)
                    count += 1
            else:
                count += 1
    return kind, count, values


# -- images inside records -----------------------------------------------------------------
def _is_encoded_image_key(key: str) -> bool:
    lowered = key.lower()
    return "encoded" in lowered or lowered.endswith(("jpeg", "jpg", "png"))


def image_problem(value: bytes) -> str | None:
    """Why encoded image bytes do not decode, or None when they decode fully."""
    fmt = sniff(bytes(value[:64]))
    if fmt not in IMAGE_FORMATS:
        return f"not an encoded image ({fmt}, {len(value)} bytes)"
    try:
        image = Image.open(io.BytesIO(value))
        if image.format == "JPEG":
            image.draft("RGB", (64, 64))
        image.load()
    except Image.DecompressionBombError as error:
        return f"decompression bomb: {error}"
    except Exception as error:  # noqa: BLE001 - any decoder failure is the finding
        return f"{fmt} does not decode: {error}"
    if fmt == "JPEG" and not bytes(value[-16:]).rstrip(b"\x00").endswith(b"\xff\xd9"):
        return "truncated JPEG: no end-of-image marker"
    return None


# -- one file ------------------------------------------------------------------------------
def _keep(bucket: list, item: Any, limit: int = EXAMPLES_KEPT) -> None:
    if len(bucket) < limit:
        bucket.append(item)


def scan_tfrecord(path: str) -> dict[str, Any]:
    """Summary of one TFRecord file for the cross-file analysis (JSON-serialisable)."""
    summary: dict[str, Any] = {
        "records": 0, "compression": "none", "corrupt": [], "unparseable": [],
        "signatures": {}, "lengths": {}, "bad_images": [], "images": 0,
    }
    try:
        stream, summary["compression"] = open_records(path)
    except OSError as error:
        summary["corrupt"].append([None, 0, f"cannot open: {error.strerror or error}"])
        return summary
    if _raw_size(stream) == 0:
        stream.close()
        summary["corrupt"].append([None, 0, "empty file (0 bytes): no records; the write was interrupted "
                                            "or never happened"])
        return summary
    try:
        _scan_stream(stream, summary)
    except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as error:
        summary["corrupt"].append([summary["records"], None, f"compressed stream is corrupt or truncated: {error}"])
    finally:
        stream.close()
    return summary


def _raw_size(stream: Any) -> int:
    """Bytes of the file under a (possibly decompressing) stream: local or remote."""
    raw = getattr(stream, "fileobj", None) or getattr(stream, "_raw", None) or stream
    if hasattr(raw, "fileno"):
        try:
            return os.fstat(raw.fileno()).st_size
        except (OSError, io.UnsupportedOperation):
            pass
    return int(getattr(raw, "size", 1))


def valid_summary(summary: Any) -> bool:
    """True when a cached summary has the shape scan_tfrecord produces (a bad cache row is no result)."""
    if not isinstance(summary, dict):
        return False
    shapes = {"records": int, "compression": str, "corrupt": list, "unparseable": list,
              "signatures": dict, "lengths": dict, "bad_images": list, "images": int}
    return all(isinstance(summary.get(key), kind) for key, kind in shapes.items())


def _scan_stream(stream: IO[bytes], summary: dict[str, Any]) -> None:
    signatures, lengths = summary["signatures"], summary["lengths"]
    for index, offset, data, problem in iter_records(stream):
        if problem:
            _keep(summary["corrupt"], [index, offset, problem], PROBLEMS_KEPT)
        if data is None:
            return
        summary["records"] += 1
        if problem:
            continue  # a corrupt payload's schema and images mean nothing
        try:
            example = parse_example(data)
        except NotAnExample as error:
            _keep(summary["unparseable"], [index, str(error)], PROBLEMS_KEPT)
            continue
        signature = json.dumps(sorted((key, kind) for key, (kind, _, _) in example.items()))
        bucket = signatures.setdefault(signature, [0, []])
        bucket[0] += 1
        _keep(bucket[1], index)
        for key, (kind, count, values) in example.items():
            per_length = lengths.setdefault(key, {}).setdefault(str(count), [0, []])
            per_length[0] += 1
            _keep(per_length[1], index)
            if kind == "bytes":
                _check_images(summary, index, key, values)


def _check_images(summary: dict[str, Any], index: int, key: str, values: list[bytes]) -> None:
    for value in values:
        looks_like_image = sniff(bytes(value[:64])) in IMAGE_FORMATS
        if not (looks_like_image or (_is_encoded_image_key(key) and value)):
            continue
        problem = image_problem(value)
        if problem:
            _keep(summary["bad_images"], [index, key, problem], PROBLEMS_KEPT)
        else:
            summary["images"] += 1


def is_tfrecord_name(name: str) -> bool:
    lowered = name.lower()
    return ".tfrecord" in lowered or lowered.endswith((".tfrec", ".tfrec.gz", ".tfrecords.gz"))
