"""A progress bar on stderr — only when stderr is a terminal, never in logs or CI.

It starts as a files/s counter; once the listing (a count of the files, done on a
background thread while the scan runs) knows the total, it becomes a bar with the total
and the time remaining.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class ScanProgress:
    """``with ScanProgress() as progress: progress.advance(n)``; silent when not a TTY."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress: Progress | None = None
        self._task: TaskID = TaskID(0)  # set with the progress display (used only then)
        self._done = 0
        self.total: int | None = None
        self._start = time.perf_counter()

    def __enter__(self) -> ScanProgress:
        if self.enabled:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed:,}{task.fields[of_total]} files · {task.fields[rate]} files/s"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(file=sys.stderr),
                transient=True,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("scanning", total=None, rate="–", of_total="")
        return self

    def stage(self, description: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=description)

    def set_total(self, total: int) -> None:
        """The number of files, once listed: the bar shows it and the time remaining."""
        self.total = total
        if self._progress is not None:
            self._progress.update(self._task, total=total, of_total=f" of {total:,}")

    def advance(self, count: int = 1) -> None:
        self._done += count
        if self._progress is not None:
            elapsed = max(time.perf_counter() - self._start, 1e-9)
            self._progress.update(self._task, advance=count, rate=f"{self._done / elapsed:,.0f}")

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
