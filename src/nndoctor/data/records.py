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

@dataclass(frozen=True)
class Unit:
    """A piece of one source that a worker reads alone."""

    reader: str  # hdf5, lmdb, webdataset, parquet, npy or npz
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


@dataclass(frozen=True)
class ReadOptions:
    images: str | None = None  # --images KEY: dataset/column/array holding the images
    labels: str | None = None  # --labels KEY


def ranges(count: int, size: int = UNIT_RECORDS) -> Iterator[tuple[int, int]]:
    for start in range(0, count, size):
        yield start, min(count, start + size)
