"""Arrow IPC files, as Hugging Face ``datasets`` ``save_to_disk`` writes them
(``train/data-00000-of-00001.arrow``): the same image and label columns as Parquet, read batch
by batch (a stream has no index to jump to, so a file is one unit)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from nndoctor.commands.data import storage
from nndoctor.commands.data.readers.parquet import choose_columns, class_names, describe, samples
from nndoctor.commands.data.records import ReadOptions, Sample, SourceInfo, Unit
from nndoctor.util.errors import UsageError


def _reader(handle: Any) -> Any:
    """A record-batch reader for either Arrow IPC layout: the file format (``ARROW1``) or the stream."""
    try:
        import pyarrow.ipc as ipc
    except ImportError:
        raise UsageError("reading Arrow files needs pyarrow: pip install 'nndoctor[parquet]'") from None
    head = handle.read(6)
    handle.seek(0)
    if head == b"ARROW1":
        source = ipc.open_file(handle)
        return source.schema, (source.get_batch(i) for i in range(source.num_record_batches))
    stream = ipc.open_stream(handle)
    return stream.schema, iter(stream)


def plan(path: str, split: str, options: ReadOptions) -> SourceInfo:
    try:
        with storage.open_input(path) as handle:
            schema, _ = _reader(handle)
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - pyarrow raises its own error types
        raise UsageError(f"{path}: Arrow file does not open ({error})") from None
    image, label = choose_columns(path, schema, options)
    info = describe(path, image, label, split)
    info.units.append(Unit("arrow", path, split, 0, 0, (image, label)))
    return info


def read(unit: Unit) -> Iterator[Sample]:
    image, label = unit.options
    with storage.open_input(unit.path) as handle:
        schema, batches = _reader(handle)
        names = class_names(schema, label) if label else None
        first = 0
        for batch in batches:
            yield from samples(unit.path, batch.select([image] + ([label] if label else [])), image, label, names,
                               first)
            first += batch.num_rows
