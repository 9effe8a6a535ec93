"""R103: the SummaryWriter probe (on a stand-in class: importing TensorBoard imports TensorFlow,
so the real writer runs once, in the buggy fixture of test_conformance) and the verdicts."""

from __future__ import annotations

import gc
import types

from nndoctor.checks.tensorboard import lost_at_child_exit, never_written
from nndoctor.instrument.patches import Patcher
from nndoctor.instrument.tensorboard_probe import WriterLog, WriterRecord, patch_writer_class


class FakeWriter:
    def __init__(self, log_dir=None):
        self.events: list[str] = []
        self.written: list[str] = []

    def add_scalar(self, tag, value, step=None):
        self.events.append(tag)

    def add_scalars(self, main_tag, values, step=None):
        for key in values:  # nested add_*: counted once
            self.add_scalar(f"{main_tag}/{key}", values[key], step)

    def flush(self):
        self.written += self.events
        self.events.clear()

    def close(self):
        self.flush()


def patched(log: WriterLog) -> tuple[type, Patcher]:
    cls = type("SummaryWriter", (FakeWriter,), dict(vars(FakeWriter)))
    patcher = Patcher()
    patch_writer_class(cls, log, types.SimpleNamespace(active=True), patcher)
    return cls, patcher


def test_counts_adds_flushes_and_where_the_writer_was_made():
    log = WriterLog()
    cls, patcher = patched(log)
    writer = cls("runs")  # the line the record names
    writer.add_scalar("loss", 1.0, 0)
    writer.add_scalars("acc", {"train": 0.5, "val": 0.4}, 0)
    writer.flush()
    writer.add_scalar("loss", 0.5, 1)
    (record,) = log.records
    assert (record.adds, record.adds_since_flush, record.flushes, record.closes) == (3, 1, 1, 0)
    assert record.created_at is not None and record.created_at.path.endswith("test_tensorboard.py")
    assert writer.written == ["loss", "acc/train", "acc/val"]  # the writer itself works as before
    writer.close()
    assert (record.adds_since_flush, record.closes) == (0, 1)
    patcher.undo_all()
    assert cls.add_scalar is FakeWriter.add_scalar and cls.__init__ is FakeWriter.__init__


def test_records_hold_no_reference_to_the_writer():
    log = WriterLog()
    cls, patcher = patched(log)
    writer = cls()
    probe = [writer]
    del writer, probe
    gc.collect()
    assert len(log.records) == 1 and not list(log._by_writer.keys())
    patcher.undo_all()


def test_verdicts():
    silent = WriterRecord(None)
    closed = WriterRecord(None, adds=20, adds_since_flush=0, closes=1)
    queued = WriterRecord(None, adds=20, adds_since_flush=20)
    assert never_written([silent, closed, queued]) == [silent]
    # in the main process a normal exit writes queued events: nothing lost
    assert lost_at_child_exit([closed, queued], in_child=False) == []
    assert lost_at_child_exit([closed, queued], in_child=True) == [queued]


def test_only_fork_and_forkserver_launchers_end_through_os_exit():
    from nndoctor.checks.tensorboard import launched_by_fork

    def frame_in(filename):
        namespace: dict = {}
        exec(compile("import sys\ndef f():\n    return sys._getframe()\n", filename, "exec"), namespace)
        return namespace["f"]()

    assert launched_by_fork(frame_in("/usr/lib/python3.11/multiprocessing/popen_fork.py"))
    assert launched_by_fork(frame_in("/usr/lib/python3.11/multiprocessing/forkserver.py"))
    assert not launched_by_fork(frame_in("/usr/lib/python3.11/multiprocessing/spawn.py"))
    assert not launched_by_fork(frame_in("/home/me/popen_fork.py"))
