"""Reading a TensorFlow tensor bundle (``tf.train.Checkpoint``, a SavedModel's ``variables/``)
without TensorFlow.

A bundle named by its prefix ``P`` is ``P.index`` plus the data shards
``P.data-00000-of-0000N``. The index is a LevelDB-format table (sorted keys, prefix-compressed
blocks, a 48-byte footer ending in a magic number); its empty key holds a BundleHeaderProto
(number of shards, byte order), every other key is a tensor name whose value is a
BundleEntryProto (dtype, shape, shard, offset, size, masked CRC32C). A tensor's bytes are
``size`` raw bytes at ``offset`` in its shard; string tensors are varint lengths, a checksum
of the lengths, then the bytes. Only these bytes are read: nothing is executed.

Every read goes through a ByteSource, so the same code reads local files and object stores
(ranged reads). The files may be hostile: offsets and sizes are checked against the files'
sizes before anything is allocated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from nndoctor.commands.ckpt import snappy_block
from nndoctor.util.errors import UsageError
from nndoctor.util.protowire import ProtoError, as_bytes, as_int, fields, read_varint, signed64

TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48
_BLOCK_TRAILER = 5  # compression type byte + masked CRC32C
_MAX_INDEX_BYTES = 1 << 30
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"

# tensorflow/core/framework/types.proto DataType -> numpy dtype name
_DTYPES = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 8: "complex64",
    9: "int64", 10: "bool", 17: "uint16", 18: "complex128", 19: "float16", 22: "uint32", 23: "uint64",
}
_DT_STRING, _DT_BFLOAT16 = 7, 14
_DTYPE_NAMES = {7: "string", 14: "bfloat16", 20: "resource", 21: "variant"}


class ByteSource(Protocol):
    """Sized, ranged reads of named files (local paths or object-store URLs)."""

    def size(self, name: str) -> int | None:
        """The file's size in bytes, None when it does not exist."""

    def read(self, name: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer only at the end of the file)."""


class LocalFiles:
    """ByteSource over the local file system."""

    def size(self, name: str) -> int | None:
        try:
            return os.stat(name).st_size if os.path.isfile(name) else None
        except OSError:
            return None

    def read(self, name: str, offset: int, length: int) -> bytes:
        with open(name, "rb") as handle:
            handle.seek(offset)
            return handle.read(length)


@dataclass
class BundleEntry:
    """Where one tensor lives in the bundle, and what it is."""

    key: str
    dtype_code: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int | None
    sliced: bool = False

    @property
    def dtype(self) -> str:
        return _DTYPES.get(self.dtype_code) or _DTYPE_NAMES.get(self.dtype_code, f"dtype#{self.dtype_code}")


class TensorBundle:
    """The index of a bundle; tensors are read on demand with ``read``."""

    def __init__(self, prefix: str, source: ByteSource | None = None) -> None:
        self.prefix = prefix
        self.source: ByteSource = source or LocalFiles()
        self.index_path = prefix + ".index"
        self.num_shards = 1
        self.big_endian = False
        self.entries: dict[str, BundleEntry] = {}
        self._load_index()

    def shard_path(self, shard: int) -> str:
        return f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}"

    # -- the index table -------------------------------------------------------------------
    def _load_index(self) -> None:
        size = self.source.size(self.index_path)
        if size is None:
            raise UsageError(f"{self.index_path}: no such file")
        if size < _FOOTER_SIZE:
            raise UsageError(f"{self.index_path}: not a TensorFlow checkpoint index ({size} bytes, "
                             f"shorter than the table footer): truncated")
        if size > _MAX_INDEX_BYTES:
            raise UsageError(f"{self.index_path}: {size} bytes is too large for a checkpoint index")
        footer = self.source.read(self.index_path, size - _FOOTER_SIZE, _FOOTER_SIZE)
        if int.from_bytes(footer[40:48], "little") != TABLE_MAGIC:
            raise UsageError(f"{self.index_path}: not a TensorFlow checkpoint index (no table magic "
                             f"number at its end): truncated or another kind of file")
        try:
            _meta_offset, pos = read_varint(footer, 0)
            _meta_size, pos = read_varint(footer, pos)
            index_offset, pos = read_varint(footer, pos)
            index_size, pos = read_varint(footer, pos)
            for _key, handle in _block_entries(self._block(index_offset, index_size, size)):
                offset, at = read_varint(handle, 0)
                length, _ = read_varint(handle, at)
                for key, value in _block_entries(self._block(offset, length, size)):
                    self._add(key, value)
        except ProtoError as error:
            raise UsageError(f"{self.index_path}: corrupted checkpoint index ({error})") from None
        if self.num_shards < 1:
            raise UsageError(f"{self.index_path}: corrupted checkpoint index (header says "
                             f"{self.num_shards} data shards)")

    def _block(self, offset: int, length: int, file_size: int) -> bytes:
        if offset + length + _BLOCK_TRAILER > file_size:
            raise ProtoError(f"a block at {offset}+{length} runs past the end of the file ({file_size} bytes)")
        raw = self.source.read(self.index_path, offset, length + _BLOCK_TRAILER)
        if len(raw) < length + _BLOCK_TRAILER:
            raise ProtoError(f"a block at {offset} is cut short")
        # TensorFlow's table reader checks this too ("block checksum mismatch")
        if masked_crc32c(raw[:length + 1]) != int.from_bytes(raw[length + 1:length + _BLOCK_TRAILER], "little"):
            raise ProtoError(f"checksum mismatch in the block at {offset}")
        compression = raw[length]
        if compression == 1:  # TensorFlow 1.x wrote Snappy-compressed index blocks
            try:
                return snappy_block.decompress(raw[:length], _MAX_INDEX_BYTES)
            except snappy_block.SnappyError as error:
                raise ProtoError(f"a Snappy-compressed block at {offset} is corrupt ({error})") from None
        if compression != 0:
            raise ProtoError(f"unknown block compression type {compression}")
        return raw[:length]

    def _add(self, key: bytes, value: bytes) -> None:
        if key == b"":
            for number, field_value in fields(value):
                if number == 1:
                    self.num_shards = as_int(field_value)
                elif number == 2:
                    self.big_endian = as_int(field_value) == 1
            return
        name = key.decode("utf-8", "replace")
        self.entries[name] = _entry(name, value)

    # -- tensors ---------------------------------------------------------------------------
    def _raw(self, entry: BundleEntry, *, check: bool = True) -> bytes:
        if not 0 <= entry.shard < self.num_shards:
            raise UsageError(f"{self.index_path}: tensor {entry.key!r} is in shard {entry.shard}, "
                             f"but the bundle has {self.num_shards}")
        path = self.shard_path(entry.shard)
        shard_size = self.source.size(path)
        if shard_size is None:
            raise UsageError(f"{path}: missing data shard of checkpoint {self.prefix} (tensor {entry.key!r})")
        if entry.offset < 0 or entry.size < 0 or entry.offset + entry.size > shard_size:
            raise UsageError(f"{path}: tensor {entry.key!r} at bytes {entry.offset}..{entry.offset + entry.size} "
                             f"runs past the shard's {shard_size} bytes: truncated")
        data = self.source.read(path, entry.offset, entry.size)
        if len(data) != entry.size:
            raise UsageError(f"{path}: short read of tensor {entry.key!r}: truncated")
        if check and entry.crc32c is not None and masked_crc32c(data) != entry.crc32c:
            raise _checksum_error(path, entry)
        return data

    def read(self, key: str) -> np.ndarray:
        """A numeric tensor as a numpy array (bfloat16 as ml_dtypes.bfloat16 or float32)."""
        entry = self.entries[key]
        count = 1
        for dim in entry.shape:
            count *= dim
        if entry.dtype_code == _DT_BFLOAT16:
            dtype: Any = np.dtype("uint16")
        elif entry.dtype_code in _DTYPES:
            dtype = np.dtype(_DTYPES[entry.dtype_code])
        else:
            raise UsageError(f"{self.index_path}: tensor {entry.key!r} has dtype {entry.dtype}, not a number")
        if count * dtype.itemsize != entry.size:
            raise UsageError(f"{self.index_path}: tensor {entry.key!r} declares shape {list(entry.shape)} "
                             f"{entry.dtype} ({count * dtype.itemsize} bytes) but {entry.size} stored bytes: "
                             f"corrupted")
        if self.big_endian:
            dtype = dtype.newbyteorder(">")
        array = np.frombuffer(bytearray(self._raw(entry)), dtype=dtype).reshape(entry.shape)  # writable
        if entry.dtype_code == _DT_BFLOAT16:
            return bfloat16_array(array)
        return array

    def read_strings(self, key: str) -> list[bytes]:
        """A string tensor's elements (lengths, a checksum of the lengths, then the bytes)."""
        entry = self.entries[key]
        data = self._raw(entry, check=False)
        count = 1
        for dim in entry.shape:
            count *= dim
        lengths, pos = [], 0
        try:
            for _ in range(count):
                length, pos = read_varint(data, pos)
                lengths.append(length)
        except ProtoError as error:
            raise UsageError(f"{self.index_path}: corrupted string tensor {key!r} ({error})") from None
        if pos + 4 + sum(lengths) > len(data):
            raise UsageError(f"{self.index_path}: corrupted string tensor {key!r} (lengths exceed its bytes)")
        if entry.crc32c is not None and _string_crc(lengths, data[pos:]) != entry.crc32c:
            raise _checksum_error(self.shard_path(entry.shard), entry)
        pos += 4  # the masked CRC32C of the lengths
        out = []
        for length in lengths:
            out.append(data[pos:pos + length])
            pos += length
        return out


def bfloat16_array(bits: np.ndarray) -> np.ndarray:
    try:
        import ml_dtypes

        return bits.view(ml_dtypes.bfloat16)
    except ImportError:  # exact: bfloat16 is the upper half of a float32
        return (bits.astype(np.uint32) << 16).view(np.float32)


def _entry(name: str, value: bytes) -> BundleEntry:
    dtype_code, shard, offset, size, crc, sliced = 0, 0, 0, 0, None, False
    shape: tuple[int, ...] = ()
    for number, field_value in fields(value):
        if number == 1:
            dtype_code = as_int(field_value)
        elif number == 2:
            shape = _shape(as_bytes(field_value))
        elif number == 3:
            shard = signed64(as_int(field_value))
        elif number == 4:
            offset = signed64(as_int(field_value))
        elif number == 5:
            size = signed64(as_int(field_value))
        elif number == 6:
            crc = as_int(field_value)
        elif number == 7:
            sliced = True
    return BundleEntry(name, dtype_code, shape, shard, offset, size, crc, sliced)


def _shape(data: bytes) -> tuple[int, ...]:
    dims: list[int] = []
    for number, value in fields(data):
        if number == 2:
            size = 0
            for dim_field, dim_value in fields(as_bytes(value)):
                if dim_field == 1:
                    size = signed64(as_int(dim_value))
            if size < 0:
                raise ProtoError(f"negative dimension {size}")
            dims.append(size)
        elif number == 3 and value:
            raise ProtoError("a stored tensor of unknown rank")
    return tuple(dims)


def _block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, value) pairs of one table block (keys share prefixes with their predecessor)."""
    if len(block) < 4:
        raise ProtoError("a block shorter than its restart count")
    restarts = int.from_bytes(block[-4:], "little")
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise ProtoError("a block's restart array is larger than the block")
    entries: list[tuple[bytes, bytes]] = []
    key = b""
    pos = 0
    while pos < end:
        shared, pos = read_varint(block, pos)
        unshared, pos = read_varint(block, pos)
        value_length, pos = read_varint(block, pos)
        if shared > len(key) or pos + unshared + value_length > end:
            raise ProtoError("a block entry runs past its block")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        entries.append((key, block[pos:pos + value_length]))
        pos += value_length
    return entries


def _checksum_error(path: str, entry: BundleEntry) -> UsageError:
    return UsageError(f"{path}: checksum mismatch in tensor {entry.key!r}: the data shard is corrupted; "
                      f"re-save or re-download the checkpoint")


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TensorFlow's (and LevelDB's) masked CRC32C of ``data``."""
    import google_crc32c

    return _mask(google_crc32c.value(data))


def _string_crc(lengths: list[int], rest: bytes) -> int:
    """The checksum TensorFlow stores for a string tensor: over each length (a little-endian
    uint32, uint64 past 4 GiB), then the 4 bytes of the masked length checksum, then the bytes."""
    import google_crc32c

    crc = google_crc32c.value(b"".join(n.to_bytes(4 if n <= 0xFFFFFFFF else 8, "little") for n in lengths))
    return _mask(google_crc32c.extend(crc, rest[:4 + sum(lengths)]))
