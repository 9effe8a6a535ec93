"""The flight record and the parts standing in for dead ranks, in process (no torchrun)."""

from __future__ import annotations

import json
import socket
import sys

from nndoctor.checks.distributed import RankDied
from nndoctor.checks.stall import CollectiveMismatch
from nndoctor.run.distributed.dead_ranks import dead_parts, native_error, pid_alive
from nndoctor.run.distributed.flight import FlightRecorder, alive_path, fatal_path, read_flight
from tests import childproc


def test_the_record_survives_the_process_that_wrote_it(tmp_path):
    # A child writes its record and is killed with SIGKILL: what it noted is still there.
    code = (
        "import os, signal, sys\n"
        "from nndoctor.run.distributed.flight import FlightRecorder\n"
        "r = FlightRecorder(sys.argv[1], 1, 2)\n"
        "r.note_phase('after step', 7, '')\n"
        "r.enter('all_gather', 12, 'bfloat16', 'train.py:40')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = childproc.run([sys.executable, "-c", code, str(tmp_path)], timeout=60, capture_output=False)
    assert result.returncode == -9
    record = read_flight(str(tmp_path), 1)
    assert record == {"step": 7, "collectives": 1, "in_collective": True, "ddp": False, "phase": "after step",
                      "op": "all_gather", "numel": 12, "dtype": "bfloat16", "location": "train.py:40",
                      "phase_location": ""}
    alive = json.loads(alive_path(str(tmp_path), 1).read_text())
    assert alive["rank"] == 1 and not pid_alive(alive["pid"])
    [part] = dead_parts(str(tmp_path), [0, 1])  # rank 0 never registered: not dead, just missing
    assert part["rank"] == 1 and part["died"]["signal"] == "SIGKILL" and part["died"]["signal_inferred"]
    assert part["report"]["status"] == "died" and part["report"]["steps"] == 7


def test_a_live_rank_is_not_dead(tmp_path):
    recorder = FlightRecorder(str(tmp_path), 0, 2)
    try:
        assert dead_parts(str(tmp_path), [0]) == []  # our own pid
        recorder.leave()
        assert read_flight(str(tmp_path), 0)["in_collective"] is False
    finally:
        recorder.close()


def test_fatal_signal_and_native_error_are_read_back(tmp_path):
    (tmp_path / "alive-rank-0.json").write_text(json.dumps(
        {"rank": 0, "world_size": 2, "pid": 2**22 + 12345, "host": socket.gethostname(),
         "log_dir": str(tmp_path / "log")}))
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "stderr.log").write_text(
        "step 3\nterminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at pair.cc:464] Received data size doesn't match expected size.\n")
    fatal_path(str(tmp_path), 0).write_text("Fatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n")
    [part] = dead_parts(str(tmp_path), [0])
    assert part["died"]["signal"] == "SIGABRT" and not part["died"]["signal_inferred"]
    assert part["died"]["native_error"].startswith("terminate called after throwing an instance of 'gloo::EnforceNotMet'")
    assert "Received data size" in part["died"]["native_error"]
    assert native_error(str(tmp_path / "missing")) is None


def _part(rank, status, flight, died=None):
    part = {"rank": rank, "pid": 100 + rank, "host": "h", "report": {"status": status, "findings": []},
            "data": {"flight": flight}}
    if died:
        part["died"] = {"signal": died, "signal_inferred": False, "native_error": None, "flight": flight}
    return part


_IN_ALL_REDUCE = {"step": 4, "in_collective": True, "ddp": True, "phase": "after step", "op": "all_reduce",
                  "numel": 1, "dtype": "float32", "location": "train.py:25", "phase_location": ""}
_IN_DDP_BACKWARD = {"step": 4, "in_collective": False, "ddp": True, "phase": "backward", "op": "",
                    "numel": 0, "dtype": "", "location": "", "phase_location": "train.py:21"}


def test_different_collectives_in_the_records_are_a_mismatch():
    parts = [_part(0, "died", _IN_ALL_REDUCE, died="SIGABRT"), _part(1, "crashed", _IN_DDP_BACKWARD)]
    [finding] = CollectiveMismatch.compare(parts)
    assert finding.code == "X110" and finding.ranks == [0, 1] and finding.location.line == 25
    assert "rank 0 was in all_reduce of 1 element (float32) at train.py:25 (step 4) while rank 1 was in " \
           "DDP's gradient all-reduce (the backward at train.py:21, step 4)" in finding.message
    [died] = RankDied.compare(parts)
    assert died.ranks == [0] and "died of SIGABRT" in died.message and died.location.line == 25


def test_the_same_collective_or_a_completed_run_is_no_mismatch():
    same = [_part(0, "crashed", _IN_ALL_REDUCE), _part(1, "died", _IN_ALL_REDUCE, died="SIGKILL")]
    assert CollectiveMismatch.compare(same) == []
    completed = [_part(0, "completed", _IN_ALL_REDUCE), _part(1, "completed", _IN_DDP_BACKWARD)]
    assert CollectiveMismatch.compare(completed) == []
    assert RankDied.compare(completed) == []




def _stalled(rank, flight):
    part = _part(rank, "stalled", flight)
    part["data"]["stall"] = {"rank": rank, "collective": None, "location": "train.py:23", "step": 4}
    return part


# NCCL: both ranks hang outside any collective (the GPU waits, the CPU is in optimizer.step);
# only rank 0 entered the epoch's all_reduce.
_AFTER_EXTRA_ALL_REDUCE = {"step": 4, "collectives": 3, "in_collective": False, "ddp": True,
                           "phase": "after backward", "op": "all_reduce", "numel": 1, "dtype": "float32",
                           "location": "train.py:27", "phase_location": "train.py:22"}
_AFTER_BROADCAST = {**_AFTER_EXTRA_ALL_REDUCE, "collectives": 2, "op": "broadcast", "numel": 132,
                    "location": "train.py:9"}


def test_stalled_ranks_whose_last_collectives_differ_are_a_mismatch():
    [finding] = CollectiveMismatch.compare([_stalled(0, _AFTER_EXTRA_ALL_REDUCE), _stalled(1, _AFTER_BROADCAST)])
    assert finding.ranks == [0, 1] and finding.location.line == 27  # the collective rank 1 never entered
    assert "when every rank stalled" in finding.message
    assert "its last collective was all_reduce of 1 element (float32) at train.py:27" in finding.message
    assert "its last collective was broadcast of 132 elements (float32) at train.py:9" in finding.message


def test_stalled_ranks_after_the_same_collective_are_no_mismatch():
    # A hang elsewhere (a data loader) after the same collectives on every rank.
    same = [_stalled(0, _AFTER_EXTRA_ALL_REDUCE), _stalled(1, dict(_AFTER_EXTRA_ALL_REDUCE))]
    assert CollectiveMismatch.compare(same) == []
    # Not every rank stalled (rank 1 finished): the last collectives are not compared.
    finished = [_stalled(0, _AFTER_EXTRA_ALL_REDUCE), _part(1, "completed", _AFTER_BROADCAST)]
    assert CollectiveMismatch.compare(finished) == []
