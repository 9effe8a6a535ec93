"""nndoctor data's progress bar learns the total from a background listing (bar + ETA)."""

from __future__ import annotations

from nndoctor.commands.data.layout import plan
from nndoctor.commands.data.progress import ScanProgress
from nndoctor.commands.data.scan import count_files_in_background


class _Recorder:
    def __init__(self) -> None:
        self.totals: list[int] = []

    def set_total(self, total: int) -> None:
        self.totals.append(total)


def test_background_listing_counts_every_file(tmp_path):
    for cls, count in (("cat", 3), ("dog", 4)):
        folder = tmp_path / cls
        folder.mkdir()
        for i in range(count):
            (folder / f"{i}.png").write_bytes(b"not really a png")
    recorder = _Recorder()
    count_files_in_background(plan([str(tmp_path)]), recorder).join(timeout=30)
    assert recorder.totals == [7]


def test_total_turns_the_counter_into_a_bar_with_eta():
    with ScanProgress(enabled=True) as progress:
        progress.advance(2)
        task = progress._progress.tasks[0]
        assert task.total is None
        progress.set_total(10)
        assert task.total == 10 and task.fields["of_total"] == " of 10"
        assert task.time_remaining is None or task.time_remaining >= 0
        columns = [type(c).__name__ for c in progress._progress.columns]
    assert "BarColumn" in columns and "TimeRemainingColumn" in columns
