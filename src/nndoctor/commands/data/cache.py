"""The on-disk cache of per-file results, so a re-scan only reads new or changed files.

SQLite in the user's cache folder (``$NNDOCTOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/nndoctor``,
else ``~/.cache/nndoctor``) — never inside the dataset. A row is valid while the file's
absolute path, size and mtime (ns) match and the probe version is the current one.
A cache that cannot be opened or written, or that holds a malformed row (a damaged or
tampered file), degrades to no cache; the scan never fails for it and says so in its stats.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path

CACHE_FILE = "data-scan.sqlite"


def cache_dir() -> Path:
    configured = os.environ.get("NNDOCTOR_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "nndoctor" if xdg else Path.home() / ".cache" / "nndoctor"


def _key(path: str) -> bytes:
    # Bytes, not text: names that are not valid UTF-8 are stored without loss.
    return os.fsencode(os.path.abspath(path))


class ScanCache:
    """Lookup and store JSON-serialised results keyed by (path, size, mtime_ns, version)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_dir() / CACHE_FILE
        self.error: str | None = None
        self._db: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS results (path BLOB PRIMARY KEY, size INTEGER, "
                "mtime_ns INTEGER, version TEXT, result TEXT)"
            )
            self._db.commit()
        except (OSError, sqlite3.Error) as error:
            self._disable(error)

    def _disable(self, error: Exception) -> None:
        self.error = f"cache disabled: {error}"
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
        self._db = None

    def lookup(self, items: Iterable[tuple[str, int, int]], version: str,
               valid: Callable[[object], bool] | None = None) -> dict[str, object]:
        """``{path: result}`` for the (path, size, mtime_ns) items whose entry is current.

        ``valid`` checks each result's shape; one malformed row disables the cache (this batch
        is then read from disk like every later one).
        """
        if self._db is None:
            return {}
        items = list(items)
        wanted = {_key(path): (path, size, mtime) for path, size, mtime in items}
        found: dict[str, object] = {}
        keys = list(wanted)
        try:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT path, size, mtime_ns, version, result FROM results WHERE path IN ({marks})",
                    chunk,
                )
                for key, size, mtime, row_version, result in rows:
                    path, want_size, want_mtime = wanted.get(key, (None, None, None))
                    if path is not None and (size, mtime, row_version) == (want_size, want_mtime, version):
                        value = json.loads(result)
                        if valid is not None and not valid(value):
                            raise ValueError(f"malformed entry for {os.fsdecode(key)!r}")
                        found[path] = value
        except (sqlite3.Error, ValueError, TypeError) as error:
            self._disable(error)
            return {}
        return found

    def store(self, items: Iterable[tuple[str, int, int, object]], version: str) -> None:
        if self._db is None:
            return
        rows = [
            (_key(path), size, mtime, version, json.dumps(result))
            for path, size, mtime, result in items
        ]
        try:
            self._db.executemany("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?)", rows)
            self._db.commit()
        except sqlite3.Error as error:
            self._disable(error)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
