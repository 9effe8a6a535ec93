"""HDF5 files (h5py): image arrays or encoded-bytes datasets, with their label arrays."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from nndoctor.commands.data import storage
from nndoctor.commands.data.formats import IMAGE_FORMATS, sniff
from nndoctor.commands.data.readers.arrays import ArrayInfo, choose, label_text
from nndoctor.commands.data.records import ReadOptions, Sample, SourceInfo, Unit, oversized, ranges
from nndoctor.util.errors import UsageError
from nndoctor.util.limits import ReadLimits, megabytes


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise UsageError("reading HDF5 needs h5py: pip install 'nndoctor[hdf5]'") from None
    return h5py


def _open(path: str) -> Any:
    h5py = _h5py()
    # A URL is read through a seekable file object: h5py fetches only the chunks it touches.
    return h5py.File(storage.open_input(path) if storage.is_url(path) else path, "r")


def _info(name: str, dataset: Any) -> ArrayInfo:
    h5py = _h5py()
    dtype = dataset.dtype
    vlen = h5py.check_vlen_dtype(dtype)
    encoded = (vlen in (bytes, np.uint8) or dtype.kind in "SV") and dataset.ndim == 1 and _holds_images(dataset)
    return ArrayInfo(name=name, shape=tuple(dataset.shape), kind=dtype.kind, encoded=encoded,
                     itemsize=dtype.itemsize)


def _holds_images(dataset: Any) -> bool:
    """A bytes dataset is taken for encoded images only if its first entry is one (class-name
    strings such as ``list_classes`` are bytes too)."""
    if not dataset.shape or dataset.shape[0] == 0:
        return False
    try:
        return sniff(_as_bytes(dataset[0])[:64]) in IMAGE_FORMATS
    except (OSError, ValueError, TypeError):
        return False


def plan(path: str, split: str, options: ReadOptions) -> SourceInfo:
    h5py = _h5py()
    arrays: list[ArrayInfo] = []
    try:
        with _open(path) as handle:
            handle.visititems(lambda name, obj: arrays.append(_info(name, obj))
                              if isinstance(obj, h5py.Dataset) and obj.shape is not None else None)
    except OSError as error:
        raise UsageError(f"{path}: HDF5 file does not open ({error})") from None
    info = SourceInfo()
    file_size = _file_size(path)
    for pair in choose(path, arrays, options.images, options.labels):
        _check_declared_size(path, pair.images, file_size)
        name = pair.split or split
        labels = pair.labels.name if pair.labels else None
        info.used[pair.images.name] = {"images": pair.images.describe(), "labels": labels, "split": name}
        info.notes.append(f"{path}: images from '{pair.images.name}' ({pair.images.describe()})"
                          + (f", labels from '{labels}'" if labels else ", no label array"))
        item_bytes = 0 if pair.images.encoded else pair.images.itemsize * math.prod(pair.images.shape[1:])
        for start, stop in ranges(pair.images.shape[0], item_bytes):
            info.units.append(Unit("hdf5", path, name, start, stop, (pair.images.name, labels, pair.images.encoded)))
    return info


# Raw image arrays compress a few times at most (gzip on photos: ~1.5–3×); a dataset declaring
# far more than its file holds was never written (every read returns the fill value) or is a bomb.
COMPRESSION_ALLOWANCE = 16


def _file_size(path: str) -> int:
    with storage.open_input(path) as handle:
        handle.seek(0, 2)
        return handle.tell()


def _check_declared_size(path: str, images: ArrayInfo, file_size: int) -> None:
    if images.encoded:
        return  # variable-length bytes are stored, not declared
    declared = images.itemsize * math.prod(images.shape)
    limit = COMPRESSION_ALLOWANCE * file_size + ReadLimits.from_env().max_inflate_bytes
    if declared > limit:
        raise UsageError(f"{path}: '{images.name}' declares {megabytes(declared)} of pixels in a file of "
                         f"{megabytes(file_size)}: it was never written, or is a decompression bomb; not read "
                         f"(NNDOCTOR_MAX_INFLATE_MB raises the allowance)")


def read(unit: Unit) -> Iterator[Sample]:
    images_key, labels_key, encoded = unit.options
    with _open(unit.path) as handle:
        too_large = None if encoded else oversized(handle[images_key].shape)
        if too_large:
            for index in range(unit.start, unit.stop):
                yield Sample(f"{unit.path}:{images_key}[{index}]", None, problem=too_large)
            return
        images = handle[images_key][unit.start:unit.stop]
        labels = handle[labels_key][unit.start:unit.stop] if labels_key else None
    for offset, value in enumerate(images):
        index = unit.start + offset
        label = label_text(labels[offset]) if labels is not None else None
        data = _as_bytes(value) if encoded else value
        yield Sample(f"{unit.path}:{images_key}[{index}]", label, data)


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, np.ndarray):
        return value.tobytes()
    if isinstance(value, np.void):
        return value.tobytes()
    return bytes(value)
