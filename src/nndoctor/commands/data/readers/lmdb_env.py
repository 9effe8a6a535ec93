"""LMDB environments: one record per key, as encoded image bytes, pickled ``(image, label)``
records, or Caffe ``Datum`` protobufs (the classic LMDB image databases).

Pickles are read without running code: a first reader refuses every global (plain tuples,
bytes and numbers need none); records that name classes (numpy arrays) go through the inert
unpickler of ``nndoctor.commands.ckpt``, which resolves only allowlisted names and calls nothing else.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterator
from typing import Any

from nndoctor.commands.data.formats import IMAGE_FORMATS, sniff
from nndoctor.commands.data.readers.arrays import label_text
from nndoctor.commands.data.records import UNIT_RECORDS, ReadOptions, Sample, SourceInfo, Unit
from nndoctor.commands.data.tfrecord import NotAnExample, _fields
from nndoctor.util.errors import UsageError

# Keys that conversion scripts use for metadata rather than samples.
METADATA_KEYS = frozenset((b"num-samples", b"length", b"len", b"keys", b"__len__", b"__keys__", b"classes"))
IMAGE_KEYS = ("image", "img", "data", "jpg", "png", "bytes", "pixels")
LABEL_KEYS = ("label", "target", "cls", "class", "y")
_SAMPLED = 64  # values looked at to decide what the database holds


class _GlobalNeeded(pickle.UnpicklingError):
    pass


class _NoGlobals(pickle.Unpickler):
    """Plain data only: any class or function reference stops the read."""

    def find_class(self, module: str, name: str) -> Any:
        raise _GlobalNeeded(f"{module}.{name}")


def _lmdb() -> Any:
    try:
        import lmdb
    except ImportError:
        raise UsageError("reading LMDB needs the lmdb package: pip install 'nndoctor[lmdb]'") from None
    return lmdb


def _open(path: str) -> Any:
    if path.startswith(("s3://", "gs://")) or "://" in path:
        raise UsageError(f"{path}: LMDB is memory-mapped and is read from a local folder only")
    folder = os.path.isdir(path)
    try:
        return _lmdb().open(path, subdir=folder, readonly=True, lock=False, readahead=False,
                            max_readers=512, create=False)
    except Exception as error:  # noqa: BLE001 - lmdb.Error and its subclasses
        raise UsageError(f"{path}: LMDB environment does not open ({error})") from None


def is_metadata_key(key: bytes) -> bool:
    return key in METADATA_KEYS or key.startswith((b"__", b"label-"))


def plan(path: str, split: str, options: ReadOptions) -> SourceInfo:
    env = _open(path)
    info = SourceInfo()
    recognised = unrecognised = 0
    try:
        with env.begin(buffers=False) as txn:
            cursor = txn.cursor()
            count = 0
            # Keys only: the values of a large database are not copied just to plan the units.
            for key in cursor.iternext(keys=True, values=False):
                if count % UNIT_RECORDS == 0:
                    info.units.append(Unit("lmdb", path, split, count, count + UNIT_RECORDS, (key,)))
                count += 1
                if count <= _SAMPLED and not is_metadata_key(key):
                    if decode_value(txn.get(key))[0] is not None:
                        recognised += 1
                    else:
                        unrecognised += 1
    finally:
        env.close()
    if info.units:
        last = info.units[-1]
        info.units[-1] = Unit("lmdb", path, split, last.start, count, last.options)
    if unrecognised and not recognised:
        from nndoctor.commands.data.detect import UnsupportedFormat

        raise UnsupportedFormat(path, "LMDB whose values are not encoded images, pickled (image, label) "
                                      "records or Caffe Datum messages")
    info.notes.append(f"{path}: LMDB with {count:,} keys")
    return info


def read(unit: Unit) -> Iterator[Sample]:
    (first,) = unit.options
    env = _open(unit.path)
    try:
        with env.begin(buffers=False) as txn:
            cursor = txn.cursor()
            if not cursor.set_key(first):
                raise KeyError(f"key {first!r} vanished while scanning")
            for _ in range(unit.stop - unit.start):
                key, value = cursor.item()
                if not is_metadata_key(key):
                    yield _sample(unit.path, key, value)
                if not cursor.next():
                    break
    finally:
        env.close()


def key_text(key: bytes) -> str:
    text = key.decode("utf-8", "backslashreplace")
    return text if text.isprintable() else repr(key)


def _sample(path: str, key: bytes, value: bytes) -> Sample:
    where = f"{path}:{key_text(key)}"
    data, label, problem = decode_value(value)
    if data is None:
        return Sample(where, None, problem=problem or f"value is {sniff(value[:64])}, not an image record")
    return Sample(where, label, data)


def decode_value(value: bytes) -> tuple[Any, str | None, str | None]:
    """(image bytes or pixels, label, problem): what one value holds; data None if not a record."""
    if sniff(value[:64]) in IMAGE_FORMATS:
        return value, None, None
    if value[:1] == b"\x80":
        return _from_pickle(value)
    return _from_datum(value)


def _from_pickle(value: bytes) -> tuple[Any, str | None, str | None]:
    try:
        record = _NoGlobals(io.BytesIO(value)).load()
    except _GlobalNeeded:
        try:
            from nndoctor.commands.ckpt.safe_unpickle import inert_load_pickle
            from nndoctor.util.limits import ReadLimits

            record = inert_load_pickle(io.BytesIO(value), ReadLimits.from_env())
        except ImportError:
            return None, None, "pickled record naming classes: reading it inertly needs torch installed"
        except Exception as error:  # noqa: BLE001 - a refused or broken pickle is the finding
            return None, None, f"pickled record refused: {error}"
    except Exception as error:  # noqa: BLE001
        return None, None, f"pickled record does not load: {error}"
    image, label = _image_and_label(record)
    if image is None:
        return None, None, f"pickled {type(record).__name__} holds no image bytes or pixel array"
    return image, label, None


def _image_and_label(record: Any) -> tuple[Any, str | None]:
    import numpy as np

    def usable(value: Any) -> bool:
        return isinstance(value, (bytes, bytearray)) or isinstance(value, np.ndarray) and value.ndim in (2, 3)

    if isinstance(record, (tuple, list)) and record and usable(record[0]):
        label = record[1] if len(record) > 1 else None
        return record[0], None if label is None else label_text(label)
    if isinstance(record, dict):
        image = next((record[k] for k in IMAGE_KEYS if k in record and usable(record[k])), None)
        label = next((record[k] for k in LABEL_KEYS if k in record), None)
        return image, None if label is None else label_text(label)
    if usable(record):
        return record, None
    return None, None


def _from_datum(value: bytes) -> tuple[Any, str | None, str | None]:
    """Caffe's Datum: channels=1 height=2 width=3 data=4 label=5 encoded=7."""
    fields: dict[int, Any] = {}
    try:
        for number, _wire, field in _fields(value):
            fields[number] = field
    except NotAnExample:
        return None, None, None
    if 4 not in fields or not isinstance(fields[4], bytes) or not set(fields) <= {1, 2, 3, 4, 5, 6, 7}:
        return None, None, None
    label = str(fields[5]) if 5 in fields else None
    if fields.get(7):
        return fields[4], label, None
    import numpy as np

    channels, height, width = fields.get(1, 0), fields.get(2, 0), fields.get(3, 0)
    if channels * height * width != len(fields[4]) or not channels:
        return None, None, f"Caffe Datum of {channels}x{height}x{width} holds {len(fields[4])} bytes"
    pixels = np.frombuffer(fields[4], dtype=np.uint8).reshape(channels, height, width)
    return pixels[::-1].copy() if channels == 3 else pixels, label, None  # Caffe stores BGR
