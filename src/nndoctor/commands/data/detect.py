"""What format a dataset path holds, decided from its content (never from its name alone).

Signatures: HDF5 ``\\x89HDF\\r\\n\\x1a\\n`` (at 0 or after a user block of 512·2ⁿ bytes), POSIX
tar ``ustar`` at byte 257 (or a valid old-style header checksum), Parquet ``PAR1`` at both
ends, NumPy ``\\x93NUMPY``, a ZIP of ``.npy`` members for ``.npz``, LMDB's ``data.mdb``, and
TFRecord framing (the masked CRC-32C of the first record's length). A name is used only to
keep reading a TFRecord file whose framing is already broken (that is F201's finding).
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib

from nndoctor.commands.data import storage
from nndoctor.commands.data.crc32c import masked_crc32c
from nndoctor.commands.data.formats import IMAGE_EXTENSIONS, IMAGE_FORMATS, sniff
from nndoctor.commands.data.tfrecord import is_tfrecord_name
from nndoctor.util.errors import UsageError

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
NUMPY_MAGIC = b"\x93NUMPY"
LMDB_MAGIC = 0xBEEFC0DE  # the meta page's mm_magic, right after the 16-byte page header

# The formats `nndoctor data` reads, as named in messages.
SUPPORTED = ("image folders (ImageFolder layout)", "TFRecord", "HDF5", "LMDB", "WebDataset tar shards",
             "Parquet / Arrow (Hugging Face datasets)", "NumPy .npy/.npz")
_HEAD = 4096


class UnsupportedFormat(UsageError):
    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: unsupported format: {what} (supported: {', '.join(SUPPORTED)})")


def detect_file(path: str) -> str:
    """"tfrecord", "hdf5", "webdataset", "parquet", "arrow", "npy", "npz" or "lmdb"; UnsupportedFormat otherwise."""
    try:
        head = storage.read_head(path, _HEAD)
    except OSError as error:
        raise UsageError(f"{path}: cannot read ({error.strerror or error})") from None
    kind = content_kind(path, head)
    if kind is not None:
        return kind
    name = storage.basename(path).lower()
    if is_tfrecord_name(name):
        return "tfrecord"  # named so and nothing else: its broken framing is F201's finding
    if len(head) < 512 and name.endswith((".tar", ".tgz", ".tar.gz")):
        return "webdataset"  # a shard cut before its first header: reported as unreadable (F101)
    raise UnsupportedFormat(path, _describe(path, head))


def content_kind(path: str, head: bytes) -> str | None:
    if _is_hdf5(path, head):
        return "hdf5"
    if head.startswith(NUMPY_MAGIC):
        return "npy"
    if head.startswith(b"ARROW1") or (head.startswith(b"\xff\xff\xff\xff") and storage.basename(path).endswith(".arrow")):
        return "arrow"  # the IPC file format, or the stream format Hugging Face save_to_disk writes
    if head.startswith(b"PAR1"):
        if storage.read_tail(path, 4) == b"PAR1":
            return "parquet"
        return None
    if head.startswith(b"PK\x03\x04"):
        return "npz" if _is_npz(path) else None
    if is_tar_header(head):
        return "webdataset"
    if len(head) >= 20 and struct.unpack_from("<I", head, 16)[0] == LMDB_MAGIC:
        return "lmdb"
    if head.startswith(b"\x1f\x8b"):
        inflated = _inflate_head(head)
        if is_tar_header(inflated):
            return "webdataset"  # a .tar.gz / .tgz shard
        if _tfrecord_framing(inflated):
            return "tfrecord"
        return None
    if _tfrecord_framing(head):
        return "tfrecord"
    return None


def detect_folder(path: str) -> str | None:
    """"lmdb" for an LMDB environment folder, None for an ordinary folder."""
    if storage.is_url(path):
        return None
    if os.path.isfile(os.path.join(path, "data.mdb")):
        return "lmdb"
    return None


def _is_hdf5(path: str, head: bytes) -> bool:
    if head.startswith(HDF5_SIGNATURE):
        return True
    # A file with a user block keeps the superblock at 512, 1024, 2048 … bytes.
    offset = 512
    while offset < len(head):
        if head[offset:offset + 8] == HDF5_SIGNATURE:
            return True
        offset *= 2
    return False


def is_tar_header(head: bytes) -> bool:
    if len(head) < 512:
        return False
    if head[257:262] == b"ustar":
        return True
    # Old (v7) tar: no magic, but the header checksum (octal at 148) covers the 512 bytes.
    try:
        stored = int(head[148:156].split(b"\0", 1)[0].strip() or b"-1", 8)
    except ValueError:
        return False
    block = bytearray(head[:512])
    block[148:156] = b" " * 8
    return stored == sum(block) and head[0] != 0


def _is_npz(path: str) -> bool:
    try:
        with storage.open_input(path) as handle, zipfile.ZipFile(handle) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False
    return bool(names) and all(name.endswith(".npy") for name in names)


def _tfrecord_framing(head: bytes) -> bool:
    if len(head) < 12:
        return False
    (stored,) = struct.unpack("<I", head[8:12])
    return masked_crc32c(head[:8]) == stored


def _inflate_head(head: bytes) -> bytes:
    """The first bytes of a gzip stream whose compressed start is ``head``."""
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 1024)
    except zlib.error:
        return b""


# Signatures of other files met where datasets live, named so the message says what the file is.
_OTHER_SIGNATURES = (
    (b"SQLite format 3\x00", "SQLite database"),
    (b"BZh", "bzip2 archive"),
    (b"\xfd7zXZ\x00", "xz archive"),
    (b"\x28\xb5\x2f\xfd", "Zstandard archive"),
    (b"7z\xbc\xaf\x27\x1c", "7-Zip archive"),
    (b"Rar!\x1a\x07", "RAR archive"),
)


def _describe(path: str, head: bytes) -> str:
    """A name for content nndoctor does not read ("ZIP archive", "unknown binary" …)."""
    if not head:
        return "empty file (0 bytes)"
    kind = sniff(head[:64])
    if kind in IMAGE_FORMATS:
        return f"a single {kind} image (give the folder that holds the images)"
    if head.startswith(b"PAR1"):
        return "Parquet file without its footer (truncated)"
    if head.startswith(b"\x1f\x8b"):
        return "gzip archive (neither a tar shard nor a TFRecord inside)"
    if head.startswith(b"version https://git-lfs.github.com/spec/"):
        return "a Git LFS pointer, not the file's content (run git lfs pull)"
    if head.startswith(b"PK\x03\x04"):
        return _describe_zip(path)
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        # e.g. CIFAR-10's python batches; not unpickled here: a pickle can run code when loaded
        return "a Python pickle (load it where you trust it and save the arrays with numpy.savez)"
    if len(head) >= 9 and head[8:9] == b"{" and head[6:8] == b"\x00\x00":
        return "a safetensors file (model weights: nndoctor ckpt inspect)"
    for signature, name in _OTHER_SIGNATURES:
        if head.startswith(signature):
            return name
    return kind


def _describe_zip(path: str) -> str:
    try:
        with storage.open_input(path) as handle, zipfile.ZipFile(handle) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return "ZIP archive (unreadable directory: truncated?)"
    if any(name.endswith("/data.pkl") or name == "data.pkl" for name in names):
        return "a PyTorch checkpoint (torch.save's ZIP: nndoctor ckpt inspect)"
    images = sum(1 for name in names if name.lower().endswith(tuple(IMAGE_EXTENSIONS)))
    if images:
        return f"ZIP archive of {images:,} image{'s' if images != 1 else ''} (extract it and give the folder)"
    return "ZIP archive"
