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

    def add_scalar(self, tag, scalar_value, global_step=None):  # SummaryWriter's parameter names
        self.events.append(tag)

    def add_scalars(self, main_tag, tag_scalar_dict, global_step=None):
        for key in tag_scalar_dict:  # nested add_*: counted once
            self.add_scalar(f"{main_tag}/{key}", tag_scalar_dict[key], global_step)

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


# --- several runs in one log directory ------------------------------------------------------
def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def write_event_file(path, steps, tag="train/loss"):
    """A TFRecord stream of Event protos (CRCs are not checked by the reader)."""
    import struct

    with open(path, "wb") as handle:
        for step in steps:
            data = b"\x10" + _varint(step) + _field(5, _field(1, _field(1, tag.encode())))
            handle.write(struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4)


def test_event_file_steps_by_tag(tmp_path):
    from nndoctor.checks.tensorboard_files import steps_by_tag

    path = tmp_path / "events.out.tfevents.1.host"
    write_event_file(path, range(1, 31))
    assert steps_by_tag(str(path)) == {"train/loss": (1, 30)}
    path.write_bytes(path.read_bytes()[:-7])  # a writer still appending: the last record is cut
    assert steps_by_tag(str(path)) == {"train/loss": (1, 29)}
    assert steps_by_tag(str(tmp_path / "missing")) == {}


def _record(log_dir, steps, earlier=(), own=(), purge=None):
    record = WriterRecord(None, adds=len(steps), log_dir=str(log_dir), earlier_files=[str(p) for p in earlier],
                          own_files=[str(p) for p in own], purge_step=purge)
    for step in steps:
        record.logged("train/loss", step)
    return record


def test_mixed_runs_verdicts(tmp_path):
    from nndoctor.checks.tensorboard import mixed_runs

    old = tmp_path / "runs" / "exp" / "events.out.tfevents.1.host"
    old.parent.mkdir(parents=True)
    write_event_file(old, range(0, 50))
    rerun = _record(old.parent, range(0, 50), earlier=[old])
    (found,) = mixed_runs([rerun])
    assert (found.tag, found.other_steps, found.own_steps) == ("train/loss", (0, 49), (0, 49))
    assert "written before this run" in found.other
    assert mixed_runs([_record(old.parent, range(50, 100), earlier=[old])]) == []  # resumed: steps continue
    assert mixed_runs([_record(old.parent, range(40, 100), earlier=[old], purge=40)]) == []  # purge_step
    assert mixed_runs([_record(tmp_path / "runs" / "other", range(0, 50))]) == []  # its own directory
    # two writers of one run (a sweep) in one directory; the second is reported, once
    sweep = tmp_path / "sweep"
    first = _record(sweep, range(1, 31), own=[sweep / "events.out.tfevents.2.host"])
    second = _record(sweep, range(1, 31), earlier=first.own_files)
    (found,) = mixed_runs([first, second])
    assert found.record is second and "SummaryWriter created at" in found.other


def test_probe_records_log_dir_steps_and_earlier_files(tmp_path):
    log = WriterLog()
    cls, patcher = patched(log)
    (tmp_path / "events.out.tfevents.1.old").write_bytes(b"")

    def init(self, log_dir=None, comment="", purge_step=None):
        FakeWriter.__init__(self, log_dir)
        self.log_dir = log_dir
        (tmp_path / "events.out.tfevents.2.new").write_bytes(b"")

    patcher.undo_all()
    cls.__init__ = init
    patch_writer_class(cls, log, types.SimpleNamespace(active=True), patcher)
    writer = cls(str(tmp_path), purge_step=7)
    writer.add_scalar("loss", 1.0, 3)
    writer.add_scalar("loss", 1.0, 9)
    writer.add_scalar("loss", 1.0)  # no step: not counted
    (record,) = log.records
    assert record.log_dir == str(tmp_path) and record.purge_step == 7
    assert record.earlier_files == [str(tmp_path / "events.out.tfevents.1.old")]
    assert record.own_files == [str(tmp_path / "events.out.tfevents.2.new")]
    assert record.steps == {"loss": (3, 9)}
    patcher.undo_all()
