"""Merging per-rank parts and the pure comparisons behind the cross-rank X checks."""

from __future__ import annotations

import argparse

import pytest

from nndoctor.checks.distributed import (
    cross_rank_findings,
    first_divergence,
    identical_batch_keys,
    param_changes,
)
from nndoctor.checks.stall import CollectiveMismatch
from nndoctor.core.findings import Finding, Location, Report, Severity
from nndoctor.run.distributed.context import parts_dir_for, refuse_launcher, torchrun_rank
from nndoctor.run.distributed.merge import merge_parts
from nndoctor.run.distributed.parts import read_parts, wait_for_parts, write_part
from nndoctor.run.distributed.rank_run import fail_on_given, script_status
from nndoctor.util.errors import UsageError


def _finding(code="O101", line=10, step=3, severity=Severity.ERROR):
    return Finding(code=code, name="x", severity=severity, message=f"m{line}", fix="f",
                   location=Location("train.py", line), first_step=step)


def _part(rank, findings=(), status="completed", steps=8, data=None, host="h"):
    report = Report(command=["train.py"], status=status, steps=steps)
    for finding in findings:
        report.add(finding)
    return {"rank": rank, "world_size": 2, "pid": 100 + rank, "host": host,
            "report": report.to_json("test"), "data": data or {}}


def test_same_finding_on_two_ranks_merges_with_its_ranks():
    parts = [_part(0, [_finding(step=3)]), _part(1, [_finding(step=1), _finding("M101", 20)])]
    merged = merge_parts(parts, command=["train.py"], world_size=2, select=[], ignore=[])
    by_code = {f.code: f for f in merged.findings}
    assert by_code["O101"].ranks == [0, 1]
    assert by_code["O101"].count == 2 and by_code["O101"].first_step == 1
    assert by_code["M101"].ranks == [1]
    data = merged.to_json("test")
    assert data["world_size"] == 2 and data["missing_ranks"] == []
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["findings"][0]["ranks"]


def test_missing_rank_and_crash_are_reported():
    parts = [_part(0, status="crashed")]
    merged = merge_parts(parts, command=["t.py"], world_size=3, select=[], ignore=[])
    assert merged.status == "crashed"
    assert merged.distributed["missing_ranks"] == [1, 2]


def test_parts_round_trip(tmp_path):
    report = Report(command=["t.py"], steps=4)
    report.add(_finding())
    write_part(str(tmp_path), 1, 2, report, {"saves": {}})
    write_part(str(tmp_path), 0, 2, report, {})
    parts = wait_for_parts(str(tmp_path), 2, timeout_s=1)
    assert [p["rank"] for p in parts] == [0, 1]
    write_part(str(tmp_path), 2, 3, report, {"stall": {"rank": 2}}, stall=True)
    assert [p["rank"] for p in read_parts(str(tmp_path))] == [0, 1, 2]
    assert [p["rank"] for p in read_parts(str(tmp_path), with_stalls=False)] == [0, 1]


def test_identical_batches_detected_only_when_every_rank_matches():
    same = {0: {"a": [1], "b": [2]}, 1: {"a": [1], "b": [2]}}
    assert identical_batch_keys(same) == (2, 2)
    different = {0: {"a": [1], "b": [2]}, 1: {"a": [1], "b": [3]}}
    assert identical_batch_keys(different) == (2, 1)
    fp = [[4, 8], 0.1, 1.0, -2.0, 2.0]
    trained = ["s|0|0", "s|0|1"]
    parts = [_part(r, data={"batches": {"s|0|0": fp, "s|0|1": fp}, "trained_batches": trained,
                            "batch_sites": {"s": {"location": {"path": "t.py", "line": 5},
                                                  "sampler": "RandomSampler"}}}) for r in (0, 1)]
    found = [f for f in cross_rank_findings(parts) if f.code == "X101"]
    assert found and found[0].ranks == [0, 1] and found[0].location == Location("t.py", 5)
    # Evaluation batches (never trained on) do not count.
    for part in parts:
        part["data"]["trained_batches"] = []
    assert not [f for f in cross_rank_findings(parts) if f.code == "X101"]


def test_first_divergence_names_step_and_parameter():
    names = ["fc.weight", "fc.bias"]
    per_rank = {0: {"1": [1.0, 2.0], "2": [1.1, 2.0]}, 1: {"1": [1.0, 2.0], "2": [1.1, 2.5]}}
    assert first_divergence(per_rank, names) == (2, "fc.bias", {0: 2.0, 1: 2.5})
    assert first_divergence({0: per_rank[0], 1: per_rank[0]}, names) is None


def test_same_path_written_by_two_ranks_on_one_host_only():
    saves = {"/tmp/ckpt.pt": {"count": 1, "location": {"path": "t.py", "line": 9}, "step": 4}}
    parts = [_part(0, data={"saves": saves}), _part(1, data={"saves": saves})]
    found = [f for f in cross_rank_findings(parts) if f.code == "X105"]
    assert found and found[0].ranks == [0, 1]
    other_host = [_part(0, data={"saves": saves}), _part(1, data={"saves": saves}, host="other")]
    assert not [f for f in cross_rank_findings(other_host) if f.code == "X105"]


def test_param_changes_names_added_replaced_and_moved():
    before = {1: ("fc.weight", (2, 3), "cpu", "float32"), 2: ("fc.bias", (2,), "cpu", "float32")}
    after = {1: ("fc.weight", (2, 3), "cuda:0", "float32"), 3: ("fc.bias", (3,), "cpu", "float32")}
    changes = param_changes(before, after)
    assert changes["added"] == ["fc.bias"] and changes["replaced"] == ["fc.bias"]
    assert changes["moved"][0].startswith("fc.weight (cpu")
    assert param_changes(before, dict(before)) == {}


def test_collective_mismatch_compares_where_ranks_are_blocked():
    def stalled(rank, collective, where):
        return _part(rank, data={"stall": {"collective": collective, "collective_location": where,
                                            "location": where, "step": 3, "idle_s": 5}})

    mismatch = [stalled(0, "all_reduce", "t.py:10"), stalled(1, None, "t.py:14")]
    found = CollectiveMismatch.compare(mismatch)
    assert found and found[0].location == Location("t.py", 10)
    assert "rank 1 at t.py:14" in found[0].message
    same = [stalled(0, "all_reduce", "t.py:10"), stalled(1, "all_reduce", "t.py:10")]
    assert CollectiveMismatch.compare(same) == []
    finished = [stalled(0, "barrier", "t.py:20"), _part(1)]
    assert "rank 1 was not blocked" in CollectiveMismatch.compare(finished)[0].message


def test_torchrun_environment_and_launcher_refusal():
    env = {"TORCHELASTIC_RUN_ID": "abc", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    info = torchrun_rank(env)
    assert info and info.rank == 1 and info.world_size == 2 and not info.is_leader
    assert torchrun_rank({"RANK": "0", "WORLD_SIZE": "2"}) is None
    assert parts_dir_for("abc", 1) != parts_dir_for("abc", 2)
    for name, is_module in (("torch.distributed.run", True), ("torchrun", False), ("/usr/bin/torchrun", False)):
        with pytest.raises(UsageError, match="torchrun --nproc_per_node N -m nndoctor run"):
            refuse_launcher(name, is_module)
    refuse_launcher("train.py", False)


def test_rank_exit_status_and_explicit_fail_on():
    assert script_status(Report(status="crashed")) == 1
    assert script_status(Report(status="completed", exit_code=4)) == 4
    assert script_status(Report(status="completed")) == 0
    args = argparse.Namespace(target=["train.py", "--fail-on", "x"])
    assert not fail_on_given(args, ["run", "train.py", "--fail-on", "x"])
    assert fail_on_given(args, ["run", "--fail-on", "warning", "train.py", "--fail-on", "x"])
