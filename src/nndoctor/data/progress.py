"""A files/s progress line on stderr — only when stderr is a terminal, never in logs or CI."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class ScanProgress:
    """``with ScanProgress() as progress: progress.advance(n)``; silent when not a TTY."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress: Progress | None = None
        self._task = None
        self._done = 0
        self._start = time.perf_counter()

    def __enter__(self) -> ScanProgress:
        if self.enabled:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TextColumn("{task.completed:,} files · {task.fields[rate]} files/s"),
                TimeElapsedColumn(),
                console=Console(file=sys.stderr),
                transient=True,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("scanning", total=None, rate="–")
        return self

    def stage(self, description: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=description)

    def advance(self, count: int = 1) -> None:
        self._done += count
        if self._progress is not None:
            elapsed = max(time.perf_counter() - self._start, 1e-9)
            self._progress.update(self._task, advance=count, rate=f"{self._done / elapsed:,.0f}")

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
