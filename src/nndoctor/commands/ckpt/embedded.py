"""Pickles hidden inside other containers: .npy object arrays, .npz members, pickle members of
any zip, the legacy torch tar format, and HDF5 attributes holding pickled bytes.

Each is scanned (pickle_scan, never loaded) so a payload is reported wherever it hides. The
loaders that would run it are ``numpy.load(allow_pickle=True)``, ``torch.load`` on a tar
checkpoint, and libraries that unpickle HDF5 attributes (PyTables, pandas).
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from dataclasses import dataclass, field
from typing import IO, Any

from nndoctor.commands.ckpt.pickle_scan import PickleCorrupt, looks_like_pickle, scan_pickle
from nndoctor.util.errors import UsageError
from nndoctor.util.limits import ReadLimits, megabytes

NPY_MAGIC = b"\x93NUMPY"


@dataclass
class EmbeddedPickle:
    """One pickle found inside a container: where, which globals, and whether it parsed."""

    where: str
    globals: list[str] = field(default_factory=list)
    error: str | None = None


def scan_bytes(where: str, data: bytes, *, max_pickles: int = 1) -> EmbeddedPickle:
    try:
        found, _count = scan_pickle(data, max_pickles=max_pickles)
    except PickleCorrupt as error:
        return EmbeddedPickle(where, error.found.names, str(error))
    return EmbeddedPickle(where, found.names)


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limits: ReadLimits) -> bytes:
    """A zip member's bytes, refusing members that inflate past the limit (zip bombs)."""
    check_zip_member(archive.filename or "archive", info, limits)
    with archive.open(info) as handle:
        data = handle.read(limits.max_inflate_bytes + 1)
    if len(data) > limits.max_inflate_bytes:
        raise UsageError(f"{archive.filename}: member {info.filename!r} inflates past "
                         f"{megabytes(limits.max_inflate_bytes)} (a zip bomb?): not read; raise the "
                         f"limit with NNDOCTOR_MAX_INFLATE_MB if you trust the file")
    return data


def check_zip_member(path: str, info: zipfile.ZipInfo, limits: ReadLimits) -> None:
    if info.compress_type != zipfile.ZIP_STORED and info.file_size > limits.max_inflate_bytes:
        raise UsageError(f"{path}: member {info.filename!r} would inflate from "
                         f"{megabytes(info.compress_size)} to {megabytes(info.file_size)} (limit "
                         f"{megabytes(limits.max_inflate_bytes)}, NNDOCTOR_MAX_INFLATE_MB): a zip bomb? "
                         f"Not read")


def check_zip_sizes(path: str, archive: zipfile.ZipFile, file_size: int, limits: ReadLimits) -> None:
    """Refuse archives whose directory promises more than the file can hold or inflate to safely.

    torch's own zip reader allocates each record's declared size before reading it.
    """
    for info in archive.infolist():
        check_zip_member(path, info, limits)
        if info.compress_type == zipfile.ZIP_STORED and (
                info.file_size != info.compress_size or info.header_offset + info.compress_size > file_size):
            raise UsageError(f"{path}: member {info.filename!r} declares {megabytes(info.file_size)} "
                             f"but the file cannot hold it: corrupted or hostile archive")


def npy_pickle(where: str, stream: IO[bytes]) -> EmbeddedPickle | None:
    """The pickle of an object-dtype .npy (after its header), or None for plain arrays."""
    try:
        _shape, dtype = npy_header(stream)
    except Exception as error:  # noqa: BLE001 - numpy raises ValueError for bad headers, SyntaxError for bad dicts
        return EmbeddedPickle(where, [], f"unreadable .npy header: {error}")
    if not dtype.hasobject:
        return None
    return scan_bytes(where, stream.read())


def npy_header(stream: IO[bytes]) -> tuple[tuple[int, ...], Any]:
    """(shape, dtype) from a .npy header; numpy parses it with ast.literal_eval, never eval."""
    import numpy as np

    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, _fortran, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, _fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    else:  # 3.0 (UTF-8 field names) has no public reader
        from numpy.lib import _format_impl

        read_header: Any = _format_impl._read_array_header  # type: ignore[attr-defined]  # private, not in the stubs
        shape, _fortran, dtype = read_header(stream, version)
    return tuple(shape), dtype


def zip_pickles(path: str, archive: zipfile.ZipFile, limits: ReadLimits, *, skip: set[str]) -> list[EmbeddedPickle]:
    """Every member of ``archive`` that is a pickle or an object .npy (torch tensor data excluded)."""
    found: list[EmbeddedPickle] = []
    for info in archive.infolist():
        name = info.filename
        if name in skip or info.is_dir() or "/data/" in f"/{name}" and not name.endswith(".pkl"):
            continue
        with archive.open(info) as handle:
            head = handle.read(8)
        if head.startswith(NPY_MAGIC):
            data = _read_member(archive, info, limits)
            item = npy_pickle(name, io.BytesIO(data))
            if item is not None:
                found.append(item)
        elif name.endswith((".pkl", ".pickle")) or (head[:1] == b"\x80" and looks_like_pickle(head)):
            item = scan_bytes(name, _read_member(archive, info, limits))
            # A member named as a pickle counts even when damaged; other bytes only when they
            # parse as a complete pickle (anything that only starts like one is just data).
            if item.error is None or name.endswith((".pkl", ".pickle")):
                found.append(item)
    return found


def tar_pickles(path: str, limits: ReadLimits) -> list[EmbeddedPickle]:
    """The pickles of torch's legacy tar format (sys_info, pickle, and the storages/tensors headers)."""
    found: list[EmbeddedPickle] = []
    try:
        with tarfile.open(path, mode="r:") as archive:
            for member in archive.getmembers():
                if not member.isfile():
                    continue
                if member.size > limits.max_inflate_bytes and member.name in ("pickle", "sys_info"):
                    raise UsageError(f"{path}: tar member {member.name!r} is {megabytes(member.size)} "
                                     f"(limit {megabytes(limits.max_inflate_bytes)}): not read")
                handle = archive.extractfile(member)
                if handle is None:
                    continue
                if member.name in ("pickle", "sys_info"):
                    found.append(scan_bytes(member.name, handle.read()))
                elif member.name in ("storages", "tensors"):
                    # A count pickle, then per entry a pickle and raw bytes: the leading pickles only.
                    found.append(scan_bytes(member.name, handle.read(min(member.size, 1 << 20)),
                                            max_pickles=2))
    except tarfile.TarError as error:
        raise UsageError(f"{path}: truncated or corrupted tar checkpoint ({error})") from None
    return found


def hdf5_pickles(handle: Any) -> list[EmbeddedPickle]:
    """HDF5 attributes whose bytes are a pickle (PyTables and pandas unpickle such attributes)."""
    import numpy as np

    found: list[EmbeddedPickle] = []

    def visit_attrs(name: str, obj: Any) -> None:
        for key in list(obj.attrs.keys()):
            try:
                value = obj.attrs[key]
            except Exception:  # noqa: BLE001 - h5py cannot decode some attribute types: not a pickle we can see
                continue
            if isinstance(value, np.void):
                value = value.tobytes()
            elif isinstance(value, np.ndarray) and value.dtype == np.uint8:
                value = value.tobytes()
            if isinstance(value, (bytes, np.bytes_)) and looks_like_pickle(bytes(value[:2])):
                item = scan_bytes(f"{name or '/'}@{key}", bytes(value))
                # Only complete pickles: text such as b"config\nvalue\n" starts like one.
                if item.error is None and item.globals:
                    found.append(item)

    visit_attrs("", handle)
    handle.visititems(visit_attrs)
    return found
