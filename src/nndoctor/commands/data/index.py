"""The per-scan index: an on-disk SQLite table of what cross-file checks need.

Per-file facts (split, class, mode, size, content hash, perceptual hash) and per-file
problems go to a temporary database instead of Python lists, so the scanner's memory does not
grow with the number of files; duplicates, minority colour modes and size outliers are then
SQL queries (SQLite sorts and groups on disk). The database is deleted when the scan ends.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

_BATCH = 2000


class ScanIndex:
    def __init__(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="nndoctor-scan-")
        self.db = sqlite3.connect(Path(self._folder) / "index.sqlite")
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute(
            "CREATE TABLE images (split TEXT, cls TEXT, path TEXT, mode TEXT, width INTEGER, "
            "height INTEGER, digest TEXT, phash INTEGER)"
        )
        self.db.execute("CREATE TABLE issues (code TEXT, split TEXT, path TEXT, detail TEXT)")
        self._images: list[tuple] = []
        self._issues: list[tuple] = []

    # -- writing -------------------------------------------------------------------------
    def add_image(
        self, split: str, cls: str, path: str, mode: str, width: int, height: int,
        digest: str, phash: int | None,
    ) -> None:
        self._images.append((split, cls, path, mode, width, height, digest, phash))
        if len(self._images) >= _BATCH:
            self._flush_images()

    def add_issue(self, code: str, split: str, path: str, detail: str) -> None:
        self._issues.append((code, split, path, detail))
        if len(self._issues) >= _BATCH:
            self._flush_issues()

    def _flush_images(self) -> None:
        self.db.executemany("INSERT INTO images VALUES (?, ?, ?, ?, ?, ?, ?, ?)", self._images)
        self._images.clear()

    def _flush_issues(self) -> None:
        self.db.executemany("INSERT INTO issues VALUES (?, ?, ?, ?)", self._issues)
        self._issues.clear()

    def finish(self) -> None:
        """Flush pending rows and build the indexes the queries use."""
        self._flush_images()
        self._flush_issues()
        self.db.execute("CREATE INDEX images_digest ON images (digest, split)")
        self.db.execute("CREATE INDEX images_split ON images (split)")
        self.db.execute("CREATE INDEX issues_code ON issues (code, path)")
        self.db.commit()

    # -- reading -------------------------------------------------------------------------
    def query(self, sql: str, params: tuple = ()) -> Iterator[tuple]:
        return self.db.execute(sql, params)

    def issues(self, code: str) -> list[tuple[str, str, str]]:
        """(split, path, detail) of every file with this per-file problem, by path."""
        return list(self.query("SELECT split, path, detail FROM issues WHERE code = ? ORDER BY path", (code,)))

    def close(self) -> None:
        self.db.close()
        shutil.rmtree(self._folder, ignore_errors=True)
