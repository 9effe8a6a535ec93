"""Find what the user pointed at: splits, class folders, image files, TFRecord files.

Layouts understood (torchvision's ImageFolder conventions):
- a folder of class folders (one split);
- a folder of split folders (``train/``, ``val/`` …), each a folder of class folders;
- several folders given explicitly, each one split;
- a flat folder of images (one split, no classes);
- TFRecord files, given as files or globs or as a folder holding only TFRecord files.

Files are yielded as they are found (``os.scandir``, unsorted) so a million-file folder is
never listed in memory; problems met while walking (unreadable folders, symlink loops,
broken links) are collected, not raised.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nndoctor.commands.data import storage
from nndoctor.commands.data.detect import UnsupportedFormat, detect_file, detect_folder
from nndoctor.commands.data.formats import IMAGE_EXTENSIONS
from nndoctor.commands.data.sources import (
    RecordSource,
    expand_braces,
    has_braces,
    is_record_name,
    split_name,
)
from nndoctor.commands.data.splitnames import SPLIT_NAMES, TRAIN_NAMES  # noqa: F401 - TRAIN_NAMES re-exported
from nndoctor.commands.data.tfrecord import is_tfrecord_name
from nndoctor.util.errors import UsageError

# Folders that tools and operating systems create and that ImageFolder would take as classes.
SYSTEM_DIR_NAMES = frozenset(
    ("__MACOSX", "__pycache__", "@eaDir", "$RECYCLE.BIN", "System Volume Information", "lost+found")
)


def is_phantom_dir(name: str) -> bool:
    return name.startswith(".") or name in SYSTEM_DIR_NAMES


@dataclass
class Split:
    """One split: a folder of class folders, or a flat folder of images (``classes`` empty)."""

    name: str
    root: str
    flat: bool = False
    classes: list[str] = field(default_factory=list)  # ImageFolder's real classes, sorted
    phantom: list[str] = field(default_factory=list)  # hidden/system folders at class level
    records: bool = False  # records of HDF5/LMDB/… files: classes are the labels seen
    remote: list[tuple[str, str, int]] | None = None  # (url, class, size) of a folder in an object store


@dataclass
class Plan:
    splits: list[Split] = field(default_factory=list)
    tfrecords: list[str] = field(default_factory=list)
    records: list[RecordSource] = field(default_factory=list)  # HDF5, LMDB, WebDataset, Parquet, NumPy
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why): never opened
    ignored: list[str] = field(default_factory=list)  # files a glob or folder matched in no supported format


def special_file_reason(path: str) -> str | None:
    """Why ``path`` (links followed) must not be opened, or None for a regular file.

    Reading a FIFO blocks until a writer comes; /dev/zero and /dev/urandom never end.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # missing or unreadable: reported where it is opened
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    return f"{kind}, not a regular file: skipped, never opened"


@dataclass(slots=True)
class FileTask:
    path: str
    split: str
    cls: str
    size: int
    mtime_ns: int


@dataclass
class WalkProblems:
    """Folder-level trouble met while walking; each entry is (path, reason)."""

    unreadable: list[tuple[str, str]] = field(default_factory=list)
    bad_names: list[str] = field(default_factory=list)
    phantom_files: dict[str, int] = field(default_factory=dict)  # phantom dir -> file count


def display(path: str) -> str:
    """A printable form of a path whose bytes may not be UTF-8 (shown with \\x escapes)."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return os.fsencode(path).decode("utf-8", "backslashreplace")


def has_bad_name(path: str) -> bool:
    try:
        os.path.basename(path).encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


# -- planning ------------------------------------------------------------------------------
def plan(paths: list[str]) -> Plan:
    """Decide the layout of the given paths; raise UsageError for paths that do not exist or
    whose format is not supported."""
    result = Plan()
    folders: list[str] = []
    for given in paths:
        for path in _expanded(given):
            if storage.is_url(path):
                _plan_url(path, result, folders)
            elif os.path.isdir(path):
                if detect_folder(path) == "lmdb":
                    result.records.append(RecordSource("lmdb", path, split_name(path)))
                elif (records := _record_files_below(path)) is not None:
                    _add_files(records, result)
                else:
                    folders.append(path)
            else:
                _plan_file_or_glob(path, result)
    if len(folders) == 1:
        result.splits.extend(_splits_of(folders[0], result))
    else:
        names: set[str] = set()
        for folder in folders:
            split = _single_split(folder, _unique_name(folder, names))
            if split is not None:
                result.splits.append(split)
            else:
                result.tfrecords.extend(_tfrecords_in(folder, result))
    if not result.splits and not result.tfrecords and not result.records and not result.skipped:
        raise UsageError(f"nothing to check in {', '.join(paths)}: no images, class folders or dataset files")
    return result


def _expanded(given: str) -> list[str]:
    if not has_braces(given):
        return [given]
    try:
        return expand_braces(given)
    except ValueError as error:
        raise UsageError(f"{given}: {error}") from None


def _plan_file_or_glob(given: str, result: Plan) -> None:
    reason = special_file_reason(given)
    if reason is not None:
        raise UsageError(f"{given}: {reason}")
    if os.path.isfile(given):
        _add_files([given], result, explicit=True)
        return
    matches = sorted(glob.glob(given, recursive=True)) if glob.has_magic(given) else []
    files = [m for m in matches if os.path.isfile(m)]
    special = [(m, r) for m in matches if (r := special_file_reason(m)) is not None]
    result.skipped += special
    if not files and not special:
        raise UsageError(f"{given}: no such file or folder")
    _add_files(files, result)


def _add_files(files: list[str], result: Plan, *, explicit: bool = False) -> None:
    """Files given (or found) one by one: their format comes from their content. A file named
    on the command line in no supported format stops the run; one a glob or a folder listing
    matched is set aside (and named in a note), unless nothing else is left to check."""
    unsupported: UnsupportedFormat | None = None
    for path in files:
        if os.path.basename(path) == "data.mdb" and not storage.is_url(path):
            folder = os.path.dirname(path) or "."
            result.records.append(RecordSource("lmdb", folder, split_name(folder)))
            continue
        try:
            kind = detect_file(path)
        except UnsupportedFormat as error:
            if explicit:
                raise
            unsupported = unsupported or error
            result.ignored.append(str(error))
            continue
        if kind == "tfrecord":
            result.tfrecords.append(path)
        else:
            result.records.append(RecordSource(kind, path, split_name(path)))
    if unsupported is not None and len(result.ignored) == len(files):
        raise unsupported


def _record_files_below(folder: str, depth: int = 2) -> list[str] | None:
    """The record-format files in a folder (and its subfolders, a Hugging Face ``data/``), when
    it holds such files and no images; None for an image folder."""
    found: list[str] = []
    for top, dirs, files in os.walk(folder):
        if top[len(folder):].count(os.sep) >= depth:
            dirs.clear()
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if "data.mdb" in files and top != folder:
            found.append(os.path.join(top, "data.mdb"))  # an LMDB environment among the files
            dirs.clear()
            continue
        for name in sorted(files):
            if os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS:
                return None
            if is_record_name(name) and not (name.startswith("cache-") and name.endswith(".arrow")):
                # cache-*.arrow: results of Hugging Face datasets' map/filter, not the dataset
                found.append(os.path.join(top, name))
    return found or None


def _plan_url(url: str, result: Plan, folders: list[str]) -> None:
    if glob.has_magic(url):
        matches = storage.url_glob(url)
        if not matches:
            raise UsageError(f"{url}: no such object")
        _add_files(matches, result)
        return
    kind = storage.url_kind(url)
    if kind == "missing":
        raise UsageError(f"{url}: no such object or prefix")
    if kind == "file":
        _add_files([url], result, explicit=True)
        return
    listing = storage.url_listing(url)
    records = [u for u, _ in listing if is_record_name(u) or is_tfrecord_name(u)]
    images = [(u, s) for u, s in listing if not is_record_name(u) and not is_tfrecord_name(u)]
    if records and not any(os.path.splitext(u)[1].lower() in IMAGE_EXTENSIONS for u, _ in images):
        _add_files(records, result)
        return
    result.splits.extend(remote_splits(url, images))


def remote_splits(url: str, listing: list[tuple[str, int]]) -> list[Split]:
    """Splits of an image folder in an object store, from its flat listing of keys."""
    base = url.rstrip("/") + "/"
    relative = [(u, u[len(base):].split("/"), s) for u, s in listing if u.startswith(base)]
    top = {parts[0] for _, parts, _ in relative if len(parts) > 1}
    by_split = {d for d in top if d.lower() in SPLIT_NAMES}
    splits = []
    if by_split:
        for name in sorted(by_split):
            files = [(u, parts[1:], s) for u, parts, s in relative if parts[0] == name and len(parts) > 1]
            splits.append(_remote_split(name, base + name, files))
    else:
        splits.append(_remote_split(storage.basename(url), url.rstrip("/"), relative))
    return splits


def _remote_split(name: str, root: str, files: list[tuple[str, list[str], int]]) -> Split:
    classes = sorted({parts[0] for _, parts, _ in files if len(parts) > 1 and not is_phantom_dir(parts[0])})
    flat = not classes
    entries = [(u, "" if flat else parts[0], s) for u, parts, s in files
               if (flat and len(parts) == 1) or (not flat and len(parts) > 1 and parts[0] in classes)]
    # Hidden folders are listed as phantom classes only for local folders (their files are counted there).
    return Split(name=name, root=root, flat=flat, classes=classes, remote=entries)


def _unique_name(folder: str, taken: set[str]) -> str:
    base = os.path.basename(os.path.normpath(os.path.abspath(folder))) or folder
    name, n = base, 2
    while name in taken:
        name, n = f"{base}#{n}", n + 1
    taken.add(name)
    return name


def _listdir(folder: str) -> tuple[list[str], list[str]]:
    """(subfolder names, file names) directly inside ``folder``."""
    try:
        entries = list(os.scandir(folder))
    except OSError as error:
        raise UsageError(f"{folder}: cannot list folder ({error.strerror or error})") from None
    dirs: list[str] = []
    files: list[str] = []
    for entry in entries:
        try:
            (dirs if entry.is_dir() else files).append(entry.name)
        except OSError:
            files.append(entry.name)
    return sorted(dirs), sorted(files)


def _tfrecords_in(folder: str, result: Plan) -> list[str]:
    _, files = _listdir(folder)
    return _regular_tfrecords(folder, files, result)


def _regular_tfrecords(folder: str, names: list[str], result: Plan) -> list[str]:
    """TFRecord-named files in ``folder`` that are regular files; the others go to ``skipped``."""
    found = []
    for name in names:
        if not is_tfrecord_name(name):
            continue
        path = os.path.join(folder, name)
        reason = special_file_reason(path)
        if reason is None:
            found.append(path)
        else:
            result.skipped.append((path, reason))
    return found


def _splits_of(folder: str, result: Plan) -> list[Split]:
    dirs, files = _listdir(folder)
    split_dirs = [d for d in dirs if d.lower() in SPLIT_NAMES]
    if split_dirs:
        return [s for s in (_single_split(os.path.join(folder, d), d) for d in split_dirs) if s]
    split = _single_split(folder, _unique_name(folder, set()))
    if split is None:
        result.tfrecords.extend(_regular_tfrecords(folder, files, result))
        return []
    return [split]


def _single_split(folder: str, name: str) -> Split | None:
    dirs, files = _listdir(folder)
    real = [d for d in dirs if not is_phantom_dir(d)]
    if real:
        phantom = [d for d in dirs if is_phantom_dir(d)]
        return Split(name=name, root=folder, classes=real, phantom=phantom)
    non_record = [f for f in files if not is_tfrecord_name(f)]
    if files and not non_record:
        return None  # a folder of TFRecord files
    # A flat folder is not read with ImageFolder, so its hidden folders are no phantom classes.
    return Split(name=name, root=folder, flat=True)


# -- walking -------------------------------------------------------------------------------
def iter_files(split: Split, problems: WalkProblems) -> Iterator[FileTask]:
    """Every file ImageFolder would consider, plus strays, as FileTasks (streamed)."""
    if split.remote is not None:
        for url, cls, size in split.remote:
            yield FileTask(url, split.name, cls, size, 0)
        return
    if split.records:
        return
    for phantom in split.phantom:
        path = os.path.join(split.root, phantom)
        problems.phantom_files[path] = sum(1 for _ in _walk(path, "", split.name, WalkProblems()))
    if split.flat:
        yield from _walk(split.root, "", split.name, problems, recurse=False)
        return
    for cls in split.classes:
        yield from _walk(os.path.join(split.root, cls), cls, split.name, problems)


def _walk(
    top: str, cls: str, split: str, problems: WalkProblems, *, recurse: bool = True
) -> Iterator[FileTask]:
    # ImageFolder follows symlinks (os.walk(followlinks=True)) and would loop forever on a
    # link to an ancestor; the ancestors' (device, inode) pairs detect that here.
    try:
        top_stat = os.stat(top)
    except OSError as error:
        problems.unreadable.append((top, f"folder unreadable: {error.strerror or error}"))
        return
    stack: list[tuple[str, frozenset[tuple[int, int]]]] = [
        (top, frozenset({(top_stat.st_dev, top_stat.st_ino)}) | _parents(top))
    ]
    while stack:
        folder, ancestors = stack.pop()
        try:
            iterator = os.scandir(folder)
        except OSError as error:
            problems.unreadable.append((folder, f"folder unreadable: {error.strerror or error}"))
            continue
        subfolders: list[str] = []
        with iterator:
            for entry in iterator:
                task = _entry_task(entry, cls, split, problems, subfolders if recurse else None)
                if task is not None:
                    yield task
        for path in sorted(subfolders, reverse=True):
            try:
                st = os.stat(path)
            except OSError as error:
                problems.unreadable.append((path, f"folder unreadable: {error.strerror or error}"))
                continue
            key = (st.st_dev, st.st_ino)
            if key in ancestors:
                problems.unreadable.append(
                    (path, f"symlink loop: points back to {os.path.realpath(path)}")
                )
                continue
            stack.append((path, ancestors | {key}))


def _parents(folder: str) -> frozenset[tuple[int, int]]:
    """(device, inode) of every folder above ``folder``: a link to any of them is a loop."""
    keys = set()
    for parent in Path(os.path.realpath(folder)).parents:
        try:
            st = os.stat(parent)
        except OSError:
            continue
        keys.add((st.st_dev, st.st_ino))
    return frozenset(keys)


def _entry_task(
    entry: os.DirEntry, cls: str, split: str, problems: WalkProblems, subfolders: list[str] | None
) -> FileTask | None:
    try:
        is_dir = entry.is_dir()
    except OSError:
        is_dir = False
    if is_dir:
        if subfolders is not None:
            subfolders.append(entry.path)
        return None
    if has_bad_name(entry.path):
        problems.bad_names.append(entry.path)
    try:
        st = entry.stat()
    except FileNotFoundError:
        reason = "broken symlink" if entry.is_symlink() else "file disappeared during the scan"
        problems.unreadable.append((entry.path, reason))
        return None
    except OSError as error:
        problems.unreadable.append((entry.path, f"cannot stat: {error.strerror or error}"))
        return None
    if not stat.S_ISREG(st.st_mode):
        # Sockets, FIFOs, devices: never opened (a FIFO would block, /dev/zero never ends).
        problems.unreadable.append((entry.path, special_file_reason(entry.path) or "not a regular file"))
        return None
    return FileTask(entry.path, split, cls, st.st_size, st.st_mtime_ns)
