"""Record-format sources among the paths given: shard patterns, formats by content, split names.

``shard-{000000..000127}.tar`` expands like WebDataset's brace notation (and like the shell's):
ranges keep their zero padding, ``{a,b}`` lists alternatives. Each file's format is detected
from its content (``detect``); its split is named after the file (``train-00000-of-00004.parquet``
→ ``train``, ``shard-000003.tar`` → ``shard``) or, for a bare number, after its folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from nndoctor.commands.data import storage
from nndoctor.commands.data.splitnames import SPLIT_NAMES

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
# Extensions of record-format files, to find them in folders (their format is still detected).
RECORD_EXTENSIONS = (".tar", ".tar.gz", ".tgz", ".parquet", ".arrow", ".h5", ".hdf5", ".hdf", ".he5", ".npy", ".npz",
                     ".mdb", ".lmdb")
_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".parquet", ".arrow", ".h5", ".hdf5", ".hdf", ".he5", ".npy", ".npz", ".lmdb",
             ".mdb", ".tfrecords", ".tfrecord", ".gz")
_SHARD_NUMBER = re.compile(r"(?:[-_.]?\d+(?:-of-\d+)?)$")
MAX_EXPANSION = 1_000_000


@dataclass(frozen=True)
class RecordSource:
    kind: str  # hdf5, lmdb, webdataset, parquet, arrow, npy, npz
    path: str
    split: str


def expand_braces(pattern: str) -> list[str]:
    """All names a brace pattern stands for, in order (a pattern without braces is itself)."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    numbers = _RANGE.match(body)
    if numbers:
        first, last = numbers.group(1), numbers.group(2)
        width = len(first) if first.lstrip("-").startswith("0") else 0
        step = 1 if int(last) >= int(first) else -1
        if abs(int(last) - int(first)) >= MAX_EXPANSION:
            raise ValueError(f"brace range {body} names over {MAX_EXPANSION:,} shards")
        choices = [str(n).zfill(width) for n in range(int(first), int(last) + step, step)]
    else:
        choices = body.split(",")
    head, tail = pattern[: match.start()], pattern[match.end():]
    return [name for choice in choices for name in expand_braces(head + choice + tail)]


def has_braces(path: str) -> bool:
    return _BRACE.search(path) is not None


def is_record_name(name: str) -> bool:
    return name.lower().endswith(RECORD_EXTENSIONS)


def split_name(path: str) -> str:
    """The split a record file belongs to, from its name (or its folder's for a bare number)."""
    base = storage.basename(path)
    lowered = base.lower()
    for suffix in _SUFFIXES:
        if lowered.endswith(suffix):
            base = base[: -len(suffix)]
            lowered = lowered[: -len(suffix)]
    base = re.sub(r"[-_.]?lmdb$", "", base, flags=re.I) or base
    named = next((t for t in re.split(r"[-_. ]+", base.lower()) if t in SPLIT_NAMES), None)
    if named is not None:
        return named  # train_catvnoncat.h5, cifar10-test-00001.tar
    stem = _SHARD_NUMBER.sub("", base).rstrip("-_.") or base
    if stem.isdigit() or stem == "data":
        parent = path.rstrip("/").rsplit("/", 2)[-2] if storage.is_url(path) else os.path.basename(
            os.path.dirname(os.path.abspath(path)))
        return parent or stem
    return stem
