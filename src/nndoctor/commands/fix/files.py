"""Writing edited sources: atomic, with the file's mode kept and an optional backup."""

from __future__ import annotations

import difflib
import os
import stat

from nndoctor.commands.fix.edit import Edit, apply_hunks
from nndoctor.util.atomic import atomic_write_text

BACKUP_SUFFIX = ".nndoctor.bak"


def read_source(path: str) -> str:
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def patched(original: str, edits: list[Edit]) -> str:
    return apply_hunks(original, [h for e in edits for h in e.hunks])


def write_source(path: str, text: str) -> None:
    """Replace ``path`` atomically (readers see the old or the new file), keeping its mode."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    atomic_write_text(path, text)
    os.chmod(path, mode)


def backup(path: str, original: str) -> str:
    """Save the text before the first edit beside the file; returns the backup's path."""
    target = path + BACKUP_SUFFIX
    atomic_write_text(target, original)
    os.chmod(target, stat.S_IMODE(os.stat(path).st_mode))
    return target


def unified_diff(path: str, original: str, new: str, shown: str | None = None) -> str:
    name = shown or path
    return "".join(difflib.unified_diff(original.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"a/{name}", tofile=f"b/{name}"))
