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

from nndoctor.data.tfrecord import is_tfrecord_name
from nndoctor.errors import UsageError

SPLIT_NAMES = frozenset(
    ("train", "training", "val", "valid", "validation", "test", "testing", "dev", "eval", "holdout")
)
TRAIN_NAMES = frozenset(("train", "training"))
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


@dataclass
class Plan:
    splits: list[Split] = field(default_factory=list)
    tfrecords: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why): never opened


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
    """Decide the layout of the given paths; raise UsageError for paths that do not exist."""
    result = Plan()
    folders: list[str] = []
    for given in paths:
        if os.path.isdir(given):
            folders.append(given)
            continue
        reason = special_file_reason(given)
        if reason is not None:
            raise UsageError(f"{given}: {reason}")
        if os.path.isfile(given):
            result.tfrecords.append(given)
            continue
        matches = sorted(glob.glob(given, recursive=True)) if glob.has_magic(given) else []
        files = [m for m in matches if os.path.isfile(m)]
        special = [(m, r) for m in matches if (r := special_file_reason(m)) is not None]
        result.skipped += special
        if not files and not special:
            raise UsageError(f"{given}: no such file or folder")
        result.tfrecords.extend(files)
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
    if not result.splits and not result.tfrecords and not result.skipped:
        raise UsageError(f"nothing to check in {', '.join(paths)}: no images, class folders or TFRecord files")
    return result


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
