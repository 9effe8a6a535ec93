"""NumPy ``.npy`` arrays (read by byte ranges after the header) and ``.npz`` archives of them."""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from nndoctor.data import storage
from nndoctor.data.readers.arrays import ArrayInfo, choose, label_text
from nndoctor.data.records import ReadOptions, Sample, SourceInfo, Unit, oversized, ranges
from nndoctor.errors import UsageError
from nndoctor.limits import ReadLimits, megabytes


def _header(handle: IO[bytes]) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """(shape, dtype, fortran_order, data offset) of an .npy stream positioned at its start."""
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
    return tuple(shape), dtype, fortran, handle.tell()


def plan(path: str, split: str, options: ReadOptions) -> SourceInfo:
    if path.lower().endswith(".npz") or _is_zip(path):
        return _plan_npz(path, split, options)
    try:
        with storage.open_input(path) as handle:
            shape, dtype, fortran, _ = _header(handle)
    except (OSError, ValueError) as error:
        raise UsageError(f"{path}: NumPy file does not open ({error})") from None
    if dtype.hasobject:
        raise UsageError(f"{path}: a NumPy array of Python objects needs unpickling, which nndoctor never does")
    info_array = ArrayInfo(name="array", shape=shape, kind=dtype.kind, encoded=False)
    pair = choose(path, [info_array], None, None)[0]
    if fortran:
        raise UsageError(f"{path}: Fortran-ordered arrays are not read record by record; save with np.save(np.ascontiguousarray(a))")
    info = SourceInfo(notes=[f"{path}: images {pair.images.describe()}, no labels"])
    item_bytes = dtype.itemsize * math.prod(shape[1:])
    info.units = [Unit("npy", path, split, a, b) for a, b in ranges(shape[0], item_bytes)]
    return info


def _is_zip(path: str) -> bool:
    return storage.read_head(path, 4) == b"PK\x03\x04"


def _npz_arrays(path: str) -> list[ArrayInfo]:
    arrays = []
    with storage.open_input(path) as raw, zipfile.ZipFile(raw) as archive:
        for name in archive.namelist():
            with archive.open(name) as member:
                shape, dtype, _, _ = _header(member)
            arrays.append(ArrayInfo(name=name.removesuffix(".npy"), shape=shape, kind=dtype.kind,
                                    encoded=False, itemsize=dtype.itemsize))
    return arrays


def _plan_npz(path: str, split: str, options: ReadOptions) -> SourceInfo:
    try:
        arrays = _npz_arrays(path)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise UsageError(f"{path}: .npz archive does not open ({error})") from None
    info = SourceInfo()
    for pair in choose(path, arrays, options.images, options.labels):
        size = pair.images.itemsize * math.prod(pair.images.shape)
        limit = ReadLimits.from_env().max_inflate_bytes
        if size > limit:
            raise UsageError(f"{path}: array '{pair.images.name}' is {megabytes(size)}; an .npz member is read "
                             f"whole and the limit is {megabytes(limit)} (NNDOCTOR_MAX_INFLATE_MB): save it as .npy "
                             f"(read in slices) or raise the limit")
        name = pair.split or split
        labels = pair.labels.name if pair.labels else None
        info.used[pair.images.name] = {"images": pair.images.describe(), "labels": labels, "split": name}
        info.notes.append(f"{path}: images from '{pair.images.name}' ({pair.images.describe()})"
                          + (f", labels from '{labels}'" if labels else ", no label array"))
        # An archive member is inflated to be read, so a whole array is one unit.
        info.units.append(Unit("npz", path, name, 0, 0, (pair.images.name, labels)))
    return info


def read(unit: Unit) -> Iterator[Sample]:
    if unit.reader == "npz":
        yield from _read_npz(unit)
        return
    with storage.open_input(unit.path) as handle:
        shape, dtype, _, offset = _header(handle)
        too_large = oversized(shape)
        if too_large:
            for index in range(unit.start, unit.stop):
                yield Sample(f"{unit.path}[{index}]", None, problem=too_large)
            return
        per_item = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        handle.seek(offset + unit.start * per_item)
        count = unit.stop - unit.start
        data = handle.read(per_item * count)
    if len(data) < per_item * count:
        complete = len(data) // per_item
        block = np.frombuffer(data[: complete * per_item], dtype=dtype).reshape((complete, *shape[1:]))
        yield from _samples(unit, "", block, None)
        for index in range(unit.start + complete, unit.stop):
            yield Sample(f"{unit.path}[{index}]", None, problem=f"truncated file: the array's header promises "
                         f"{shape[0]:,} items, the data ends before item {index}")
        return
    block = np.frombuffer(data, dtype=dtype).reshape((count, *shape[1:]))
    yield from _samples(unit, "", block, None)


def _read_npz(unit: Unit) -> Iterator[Sample]:
    images_key, labels_key = unit.options
    with storage.open_input(unit.path) as raw, zipfile.ZipFile(raw) as archive:
        images = _load_member(archive, images_key)
        labels = _load_member(archive, labels_key) if labels_key else None
    yield from _samples(unit, f":{images_key}", images, labels)


def _load_member(archive: zipfile.ZipFile, key: str) -> np.ndarray:
    with archive.open(key + ".npy") as member:
        return np.lib.format.read_array(member, allow_pickle=False)


def _samples(unit: Unit, key: str, images: Any, labels: Any) -> Iterator[Sample]:
    for offset, pixels in enumerate(images):
        label = label_text(labels[offset]) if labels is not None else None
        yield Sample(f"{unit.path}{key}[{unit.start + offset}]", label, pixels)
