"""Reading and probing units of record files: the worker side of HDF5, LMDB, WebDataset,
Parquet and NumPy scans (a local worker process or a Ray task runs ``probe_units``)."""

from __future__ import annotations

from typing import Any

from nndoctor.commands.data.probe import FileRecord, probe_bytes, probe_pixels, unreadable
from nndoctor.commands.data.readers import arrow, hdf5, lmdb_env, numpy_arrays, parquet, webdataset
from nndoctor.commands.data.records import ReadOptions, Sample, SourceInfo, Unit

_MODULES: dict[str, Any] = {"arrow": arrow, "hdf5": hdf5, "lmdb": lmdb_env, "webdataset": webdataset, "parquet": parquet,
                            "npy": numpy_arrays, "npz": numpy_arrays}


def reader(name: str) -> Any:
    """The module that plans and reads one format."""
    return _MODULES[name]


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
