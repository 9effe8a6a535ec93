"""Datasets stored as records (HDF5, LMDB, WebDataset, Parquet, NumPy): the types readers share.

A reader cuts a source into ``Unit``s (a shard, a row group, a range of indices): small,
picklable descriptions that a worker process or a Ray task opens on its own. Reading a unit
yields ``Sample``s (the record's name, its label, its encoded bytes or pixel array), which are
probed like files (``record_probe``) and then enter the same scan index and analysis as image
folders: the findings are the folder findings, at the record.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

UNIT_RECORDS = 256  # records per unit: enough to amortise opening the file, small enough to balance
UNIT_BYTES = 64 << 20  # at most this much of an array read per unit (large images: fewer per unit)

@dataclass(frozen=True)
class Unit:
    """A piece of one source that a worker reads alone."""

    reader: str  # hdf5, lmdb, webdataset, parquet, arrow, npy or npz
    path: str  # the file (or LMDB folder), local or a URL
    split: str
    start: int = 0
    stop: int = 0
    options: tuple[Any, ...] = ()  # reader-specific: dataset keys, column names, a first key


@dataclass
class Sample:
    """One record: where it is (``file:member[index]``), its label and its payload."""

    location: str
    label: str | None
    data: Any = None  # bytes (an encoded image) or a numpy array (pixels)
    extension: str | None = None  # the member's extension where the format names one (WebDataset)
    problem: str | None = None  # the record could not be read (truncated shard, bad chunk)


@dataclass
class SourceInfo:
    """What a reader found in one source: the units, and notes for the report."""

    units: list[Unit] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    used: dict[str, Any] = field(default_factory=dict)  # e.g. the HDF5 datasets read


def oversized(shape: tuple[int, ...]) -> str | None:
    """Why one image of an array with this shape is not read (too many pixels), or None."""
    from nndoctor.commands.data.probe import MAX_PIXELS

    if len(shape) < 3:
        return None
    height, width = (shape[2], shape[3]) if len(shape) == 4 and shape[1] in (1, 3, 4) and shape[3] not in (1, 3, 4) \
        else (shape[1], shape[2])
    if height * width > MAX_PIXELS:
        return (f"decompression bomb: {width}x{height} = {width * height / 1e6:.0f} Mpx per image exceeds "
                f"Pillow's limit of {MAX_PIXELS / 1e6:.0f} Mpx; not read")
    return None


@dataclass(frozen=True)
class ReadOptions:
    images: str | None = None  # --images KEY: dataset/column/array holding the images
    labels: str | None = None  # --labels KEY


def ranges(count: int, item_bytes: int = 0) -> Iterator[tuple[int, int]]:
    """(start, stop) of the units over ``count`` records of ``item_bytes`` each (0: unknown)."""
    size = max(1, min(UNIT_RECORDS, UNIT_BYTES // item_bytes)) if item_bytes else UNIT_RECORDS
    for start in range(0, count, size):
        yield start, min(count, start + size)
