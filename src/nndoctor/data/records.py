"""Datasets stored as records (HDF5, LMDB, WebDataset, Parquet, NumPy): units of work and samples.

A reader cuts a source into ``Unit``s (a shard, a row group, a range of indices): small,
picklable descriptions that a worker process or a Ray task opens on its own. Reading a unit
yields ``Sample``s (the record's name, its label, its encoded bytes or pixel array), which are
probed like files (``probe.probe_bytes`` / ``probe_pixels``) and then enter the same scan index
and analysis as image folders: the findings are the folder findings, at the record.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nndoctor.data.probe import FileRecord, probe_bytes, probe_pixels, unreadable

UNIT_RECORDS = 256  # records per unit: enough to amortise opening the file, small enough to balance

_READERS = {
    "hdf5": "nndoctor.data.readers.hdf5",
    "lmdb": "nndoctor.data.readers.lmdb_env",
    "webdataset": "nndoctor.data.readers.webdataset",
    "parquet": "nndoctor.data.readers.parquet",
    "npy": "nndoctor.data.readers.numpy_arrays",
    "npz": "nndoctor.data.readers.numpy_arrays",
}


@dataclass(frozen=True)
class Unit:
    """A piece of one source that a worker reads alone."""

    reader: str  # a key of _READERS
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


def reader(name: str) -> Any:
    return importlib.import_module(_READERS[name])


def plan_source(kind: str, path: str, split: str, options: ReadOptions) -> SourceInfo:
    return reader(kind).plan(path, split, options)


def probe_sample(sample: Sample) -> FileRecord:
    if sample.problem is not None:
        return unreadable(sample.problem)
    if isinstance(sample.data, (bytes, bytearray, memoryview)):
        return probe_bytes(bytes(sample.data))
    return probe_pixels(sample.data)


def probe_unit(unit: Unit) -> list[list]:
    """Worker entry point: read one unit and probe its samples. Rows are
    ``[location, split, label, extension, record_json]``; a unit that fails to open is one row."""
    rows = []
    try:
        for sample in reader(unit.reader).read(unit):
            rows.append([sample.location, unit.split, sample.label, sample.extension,
                         probe_sample(sample).to_json()])
    except Exception as error:  # noqa: BLE001 - a broken shard is a finding, not a crash
        where = f"{unit.path}[{unit.start}:{unit.stop}]" if unit.stop else unit.path
        rows.append([where, unit.split, None, None, unreadable(f"cannot read: {error}").to_json()])
    return rows


def probe_units(units: list[Unit]) -> list[list[list]]:
    return [probe_unit(unit) for unit in units]


def ranges(count: int, size: int = UNIT_RECORDS) -> Iterator[tuple[int, int]]:
    for start in range(0, count, size):
        yield start, min(count, start + size)
