"""NumPy ``.npy`` arrays (read by byte ranges after the header) and ``.npz`` archives of them."""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from nndoctor.commands.data import storage
from nndoctor.commands.data.readers.arrays import ArrayInfo, choose, is_image_array, label_text
from nndoctor.commands.data.records import ReadOptions, Sample, SourceInfo, Unit, oversized, ranges
from nndoctor.util.errors import UsageError
from nndoctor.util.limits import ReadLimits, megabytes


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
    shape, dtype, fortran = _npy_header(path)
    if dtype.hasobject:
        raise UsageError(f"{path}: a NumPy array of Python objects needs unpickling, which nndoctor never does")
    info_array = ArrayInfo(name="array", shape=shape, kind=dtype.kind, encoded=False)
    choose(path, [info_array], None, None)
    if fortran:
        raise UsageError(f"{path}: Fortran-ordered arrays are not read record by record; save with np.save(np.ascontiguousarray(a))")
    return _plan_npy(path, split, info_array, dtype, None)


def _npy_header(path: str) -> tuple[tuple[int, ...], np.dtype, bool]:
    try:
        with storage.open_input(path) as handle:
            shape, dtype, fortran, _ = _header(handle)
    except (OSError, ValueError) as error:
        raise UsageError(f"{path}: NumPy file does not open ({error})") from None
    return shape, dtype, fortran


def _plan_npy(path: str, split: str, images: ArrayInfo, dtype: np.dtype, labels: str | None) -> SourceInfo:
    shown = f", labels from {storage.basename(labels)}" if labels else ", no labels"
    info = SourceInfo(notes=[f"{path}: images {images.describe()}{shown}"])
    item_bytes = dtype.itemsize * math.prod(images.shape[1:])
    info.units = [Unit("npy", path, split, a, b, (labels,) if labels else ()) for a, b in ranges(images.shape[0], item_bytes)]
    return info


def plan_pairs(sources: list[tuple[str, str]], options: ReadOptions) -> tuple[list[SourceInfo], set[str]]:
    """.npy files of one folder that pair images with labels (``X_train.npy`` + ``y_train.npy``,
    ``images.npy`` + ``labels.npy``), chosen by name and length as the arrays of an .npz are:
    their plans, and every path they use. Other .npy files are planned alone."""
    if options.images is not None or options.labels is not None:
        return [], set()
    folders: dict[str, list[tuple[str, str]]] = {}
    for path, split in sources:
        if not path.lower().endswith(".npy"):
            continue
        folders.setdefault(path.rsplit("/", 1)[0] if "/" in path else "", []).append((path, split))
    infos: list[SourceInfo] = []
    used: set[str] = set()
    for folder, members in folders.items():
        arrays: dict[str, tuple[str, str, ArrayInfo, np.dtype]] = {}
        for path, split in members:
            try:
                shape, dtype, fortran = _npy_header(path)
            except UsageError:
                continue  # reported when planned alone
            if dtype.hasobject or fortran:
                continue
            name = storage.basename(path)[: -len(".npy")]
            arrays[name] = (path, split, ArrayInfo(name, shape, dtype.kind, False, dtype.itemsize), dtype)
        infos_here = [entry[2] for entry in arrays.values()]
        if not any(is_image_array(a) for a in infos_here) or all(is_image_array(a) for a in infos_here):
            continue
        try:
            pairs = choose(folder or ".", infos_here, None, None)
        except UsageError:
            continue
        for pair in pairs:
            if pair.labels is None:
                continue
            path, split, images, dtype = arrays[pair.images.name]
            labels = arrays[pair.labels.name][0]
            infos.append(_plan_npy(path, pair.split or split, images, dtype, labels))
            used |= {path, labels}
        if any(entry[0] in used for entry in arrays.values()):
            for path, _split, array, _dtype in arrays.values():
                if path not in used and not is_image_array(array):  # y_val.npy without its images
                    infos.append(SourceInfo(notes=[f"{path}: {array.describe()} paired with no image array: not read"]))
                    used.add(path)
    return infos, used


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
    labels = _label_slice(unit.options[0], unit.start, unit.stop) if unit.options else None
    if len(data) < per_item * count:
        complete = len(data) // per_item
        block = np.frombuffer(data[: complete * per_item], dtype=dtype).reshape((complete, *shape[1:]))
        yield from _samples(unit, "", block, labels)
        for index in range(unit.start + complete, unit.stop):
            yield Sample(f"{unit.path}[{index}]", None, problem=f"truncated file: the array's header promises "
                         f"{shape[0]:,} items, the data ends before item {index}")
        return
    block = np.frombuffer(data, dtype=dtype).reshape((count, *shape[1:]))
    yield from _samples(unit, "", block, labels)


def _label_slice(path: str, start: int, stop: int) -> np.ndarray | None:
    """Labels ``start:stop`` of a label .npy, by a ranged read; None where the file ends early."""
    with storage.open_input(path) as handle:
        shape, dtype, _, offset = _header(handle)
        per_item = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        handle.seek(offset + start * per_item)
        data = handle.read(per_item * (stop - start))
    if len(data) < per_item * (stop - start):
        return None  # a truncated label file: the images are still checked, without their labels
    return np.frombuffer(data, dtype=dtype).reshape((stop - start, *shape[1:]))


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
