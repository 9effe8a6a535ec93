"""Parquet files, as Hugging Face ``datasets`` writes them: an image column of ``{bytes, path}``
structs (or plain binary) and a label column, read row group by row group.

Only the columns used are read; over a URL pyarrow fetches the footer and those column chunks
by ranged reads. Class names come from the ``ClassLabel`` feature in the file's Hugging Face
metadata when it has one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from nndoctor.commands.data import storage
from nndoctor.commands.data.readers.arrays import LABEL_NAMES, label_text
from nndoctor.commands.data.records import ReadOptions, Sample, SourceInfo, Unit
from nndoctor.util.errors import UsageError

MAX_REFERENCED = 1 << 30  # bytes read from a file an image cell refers to
IMAGE_COLUMNS = ("image", "images", "img", "jpg", "png", "picture", "pixel_values")


def _pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError("reading Parquet needs pyarrow: pip install 'nndoctor[parquet]'") from None
    return pq


def _is_image_type(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return True
    return pa.types.is_struct(kind) and any(
        kind.field(i).name == "bytes" and (pa.types.is_binary(kind.field(i).type) or pa.types.is_large_binary(kind.field(i).type))
        for i in range(kind.num_fields))


def _is_label_type(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)


def class_names(schema: Any, column: str) -> list[str] | None:
    metadata = schema.metadata or {}
    try:
        features = json.loads(metadata[b"huggingface"])["info"]["features"]
        names = features[column]["names"]
    except (KeyError, ValueError, TypeError):
        return None
    return [str(n) for n in names] if isinstance(names, list) else None


def _class_label_columns(schema: Any) -> list[str]:
    """Columns whose Hugging Face feature is a ClassLabel (``fine_label`` of CIFAR-100), in order."""
    try:
        features = json.loads((schema.metadata or {})[b"huggingface"])["info"]["features"]
        return [name for name, feature in features.items()
                if isinstance(feature, dict) and feature.get("_type") == "ClassLabel"]
    except (KeyError, ValueError, TypeError, AttributeError):
        return []


def choose_columns(path: str, schema: Any, options: ReadOptions) -> tuple[str, str | None]:
    """(image column, label column or None) of a table schema; UsageError when there is no image column."""
    columns = {schema.field(i).name: schema.field(i).type for i in range(len(schema))}
    shown = ", ".join(f"{n} ({t})" for n, t in columns.items())
    image = options.images or next((c for c in IMAGE_COLUMNS if c in columns and _is_image_type(columns[c])),
                                   next((c for c, t in columns.items() if _is_image_type(t)), None))
    if image is None or image not in columns or not _is_image_type(columns[image]):
        raise UsageError(f"{path}: no image column ({{bytes, path}} struct or binary) "
                         f"{'named ' + image if image else 'found'}; columns: {shown}; pass --images COLUMN")
    label = options.labels or next((c for c in LABEL_NAMES if c in columns and _is_label_type(columns[c])), None) \
        or next((c for c in _class_label_columns(schema) if c in columns and _is_label_type(columns[c])), None)
    if label is not None and (label not in columns or not _is_label_type(columns[label])):
        raise UsageError(f"{path}: --labels {label}: no integer or string column of that name; columns: {shown}")
    return image, label


def describe(path: str, image: str, label: str | None, split: str) -> SourceInfo:
    info = SourceInfo(notes=[f"{path}: images from column '{image}'"
                             + (f", labels from column '{label}'" if label else ", no label column")])
    info.used[image] = {"labels": label, "split": split}
    return info


def plan(path: str, split: str, options: ReadOptions) -> SourceInfo:
    pq = _pyarrow()
    try:
        with storage.open_input(path) as handle:
            metadata = pq.ParquetFile(handle).metadata
            schema = metadata.schema.to_arrow_schema()
    except Exception as error:  # noqa: BLE001 - pyarrow raises its own error types
        raise UsageError(f"{path}: Parquet file does not open ({error})") from None
    image, label = choose_columns(path, schema, options)
    info = describe(path, image, label, split)
    start = 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        info.units.append(Unit("parquet", path, split, start, start + rows, (image, label, group)))
        start += rows
    return info


def read(unit: Unit) -> Iterator[Sample]:
    pq = _pyarrow()
    image, label, group = unit.options
    with storage.open_input(unit.path) as handle:
        source = pq.ParquetFile(handle)
        names = class_names(source.schema_arrow, label) if label else None
        table = source.read_row_group(group, columns=[image] + ([label] if label else []))
    yield from samples(unit.path, table, image, label, names, unit.start)


def samples(path: str, table: Any, image: str, label: str | None, names: list[str] | None,
            first: int) -> Iterator[Sample]:
    """The records of a table (a Parquet row group, an Arrow record batch) whose first row is ``first``."""
    images = table.column(image).to_pylist()
    labels = table.column(label).to_pylist() if label else [None] * len(images)
    for offset, (value, raw_label) in enumerate(zip(images, labels)):
        where = f"{path}:{image}[{first + offset}]"
        text = None if raw_label is None else (
            names[raw_label] if names and isinstance(raw_label, int) and 0 <= raw_label < len(names)
            else label_text(raw_label))
        data = value.get("bytes") if isinstance(value, dict) else value
        if data is None:
            if isinstance(value, dict) and value.get("path"):
                referenced = _referenced_image(path, str(value["path"]))
                if referenced is not None:
                    yield Sample(where, text, **referenced)
                continue
            yield Sample(where, text, problem="empty image cell (null): the loader gets None")
            continue
        yield Sample(where, text, data)


def _referenced_image(table_path: str, image_path: str) -> dict[str, Any] | None:
    """A ``{bytes: None, path}`` cell: ``datasets`` opens that file when the row is read. Its
    content (``data=``), a ``problem=`` when an absolute path names no file, or None when the
    path cannot be resolved from here (relative to an unknown working directory, a URL)."""
    if storage.is_url(table_path) or "://" in image_path:
        return None
    # datasets opens a relative path from the working directory; beside the table is tried too
    candidates = [image_path] if os.path.isabs(image_path) else \
        [image_path, os.path.join(os.path.dirname(table_path), image_path)]
    for candidate in candidates:
        if os.path.isfile(candidate):
            try:
                return {"data": storage.read_bytes(candidate, MAX_REFERENCED)}
            except OSError as error:
                return {"problem": f"image file {image_path} cannot be read ({error.strerror or error})"}
    if os.path.isabs(image_path):
        return {"problem": f"image file {image_path} does not exist (datasets raises FileNotFoundError for this row)"}
    return None
