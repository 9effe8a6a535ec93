"""Detection functions of P101–P110 and diagnose() on synthetic measurements."""
from __future__ import annotations

import pytest

from nndoctor.commands.perf import detection
from nndoctor.commands.perf.config import PerfConfig
from nndoctor.commands.perf.timeline import StepRecord, summarize
from nndoctor.commands.perf.torch import diagnosis
from nndoctor.commands.perf.torch.recorder import LoopFacts
from nndoctor.commands.perf.torch.result import DeviceInfo, other_gpu_processes
from nndoctor.commands.perf.torch.result import TorchPerfResult as PerfResult
from nndoctor.core.findings import Location, Severity


def test_data_bound_threshold_and_amdahl_bound():
    assert detection.data_bound(0.19, 1.0) is None
    found = detection.data_bound(0.62, 1.0)
    assert found["data_wait_fraction"] == pytest.approx(0.62)
    assert found["max_speedup"] == pytest.approx(1 / 0.38, rel=1e-2)


def test_loader_costs_time_needs_workers_zero_real_wait_and_steps():
    assert detection.loader_costs_time(0, 0.5, 1.0, 50, 20)["mean_wait_ms"] == pytest.approx(10.0)
    assert detection.loader_costs_time(4, 0.5, 1.0, 50, 20) is None  # already has workers
    assert detection.loader_costs_time(0, 0.05, 0.1, 50, 20) is None  # 1 ms a batch: tiny dataset
    assert detection.loader_costs_time(0, 0.5, 1.0, 50, 2) is None  # too few steps


def test_sync_overlap_bound_is_capped_by_blocked_time_and_host_work():
    assert detection.sync_overlap_bound({"sync": 0.3, "data": 0.1, "other": 0.05}, 1.0) == pytest.approx(0.15)
    assert detection.sync_overlap_bound({"sync": 0.1, "data": 0.5}, 1.0) == pytest.approx(0.1)


def test_hardware_conditions():
    assert detection.fp32_on_tensor_cores("cuda", (9, 0), "float32", False)
    assert not detection.fp32_on_tensor_cores("cuda", (6, 1), "float32", False)
    assert not detection.fp32_on_tensor_cores("cuda", (9, 0), "float32", True)
    assert not detection.fp32_on_tensor_cores("cpu", None, "float32", False)
    assert detection.nchw_conv_on_gpu("cuda", True, False)
    assert not detection.nchw_conv_on_gpu("cuda", True, True)
    assert detection.fixed_shapes_without_benchmark("cuda", True, {(8, 3, 32, 32)}, False)
    assert not detection.fixed_shapes_without_benchmark("cuda", True, {(8, 3, 32, 32), (4, 3, 32, 32)}, False)
    assert detection.dataparallel_severity([0, 1]) == Severity.WARNING
    assert detection.dataparallel_severity([]) == Severity.INFO


def test_other_gpu_processes_sets_ours_aside():
    procs = [{"pid": 10, "used_memory_bytes": 5}, {"pid": 11, "used_memory_bytes": 9}]
    assert other_gpu_processes(procs, 10) == [{"pid": 11, "used_memory_bytes": 9}]
    # In a container our PID is not NVML's: one process (the largest, the run) is ours.
    assert other_gpu_processes(procs, 99) == [{"pid": 10, "used_memory_bytes": 5}]
    assert other_gpu_processes(procs[:1], 99) == []


def _result(trials=None, **fact_values):
    records = []
    for step in range(1, 11):
        r = StepRecord(step=step, wall=0.1)
        r.phases["data"] = 0.05
        r.phases["sync"] = 0.01
        r.syncs = 2
        r.gpu_busy = 0.03
        records.append(r)
    facts = LoopFacts(device="cuda", param_dtype="float32", has_conv=True, input_shapes={(8, 3, 32, 32)},
                      input_channels_last=False, loader_location=Location("train.py", 12),
                      forward_location=Location("train.py", 20),
                      sync_kinds={".item()": 20}, sync_locations={Location("train.py", 25): 20})
    for key, value in fact_values.items():
        setattr(facts, key, value)
    device = DeviceInfo(name="NVIDIA H100", cuda=True, capability=(9, 0),
                        other_processes=[{"pid": 7, "used_memory_bytes": 2**30}])
    return PerfResult(PerfConfig(), summarize(records), facts, device, trials or {}, 15)


def test_diagnose_reports_each_problem_with_evidence():
    findings = {f.code: f for f in diagnosis.diagnose(_result())}
    assert set(findings) == {"P101", "P103", "P104", "P105", "P106", "P109", "P110", "P115"}
    assert findings["P101"].evidence["data_wait_fraction"] == pytest.approx(0.5)
    assert findings["P101"].location == Location("train.py", 12)
    assert findings["P103"].location == Location("train.py", 25)
    assert findings["P103"].evidence["syncs_per_step"] == pytest.approx(2.0)
    assert findings["P109"].evidence["gpu_busy_fraction"] == pytest.approx(0.3)
    # Not measured: advice is info, and says how to measure it.
    assert findings["P105"].severity == Severity.INFO and "--try amp" in findings["P105"].message


def test_measured_trials_confirm_or_withdraw_advice():
    trials = {
        "amp": {"speedup": 2.1, "noise": 0.02, "pays_off": True, "base_s": 0.1, "variant_s": 0.047,
                "loss_change": 0.004, "loss_ok": True},
        "channels_last": {"speedup": 1.01, "noise": 0.03, "pays_off": False, "base_s": 0.1, "variant_s": 0.099,
                          "loss_change": 0.0, "loss_ok": True},
        "loader": {"best": {"num_workers": 8, "pin_memory": True, "prefetch_factor": 2, "samples_per_s": 900.0},
                   "current": {"num_workers": 0, "pin_memory": False, "samples_per_s": 300.0}, "speedup": 3.0},
    }
    result = _result(trials)
    findings = {f.code: f for f in diagnosis.diagnose(result)}
    assert findings["P105"].severity == Severity.WARNING and findings["P105"].evidence["speedup"] == 2.1
    assert "P106" not in findings  # measured: no gain
    assert findings["P102"].evidence["speedup"] == 3.0 and "num_workers=8" in findings["P102"].fix
    changes = {a["change"] for a in diagnosis.advice(result)}
    assert changes == {"loader", "amp", "fewer-syncs"}


def test_no_cuda_no_gpu_findings():
    result = _result(device="cpu", sync_kinds={}, sync_locations={})
    result.device = DeviceInfo()
    result.breakdown.gpu_busy = result.breakdown.gpu_wall = None  # no CUDA events on CPU
    assert {f.code for f in diagnosis.diagnose(result)} == {"P101"}
