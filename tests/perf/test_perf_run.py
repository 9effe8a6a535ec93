"""nndoctor perf end to end on CPU: the breakdown, P101's fraction, P103 with a CPU stand-in, the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nndoctor.commands.perf.config import PerfConfig
from nndoctor.commands.perf.session import run_perf
from nndoctor.commands.perf.torch.diagnosis import diagnose
from nndoctor.core.engine import Session
from nndoctor.run.runner import Target

SCRIPTS = Path(__file__).parent / "scripts"


def line_of(script: str, text: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


def perf(script, *args, **config):
    return run_perf(Target(str(SCRIPTS / script), list(args)), PerfConfig(**config))


def test_slow_getitem_makes_the_loop_input_bound_with_the_right_fraction():
    # 8 samples x 4 ms of loading (>= 32 ms) against 8 ms of "compute" per step.
    report, result = perf("slow_loader.py", "0.004", "0.008", warmup=2, steps=8)
    b = result.breakdown
    assert report.status == "stopped" and b.steps == 8
    data_per_step = b.phases["data"] / b.steps
    assert data_per_step >= 8 * 0.004  # sleep never undershoots
    assert b.phases["backward"] + b.phases["optimizer"] + b.phases["other"] >= 8 * 0.008 * 0.9
    # The fraction is what was measured, and sits near 32/(32+8) on an idle machine.
    fraction = b.fraction("data")
    assert fraction == pytest.approx(b.phases["data"] / b.wall)
    assert 0.55 < fraction < 0.92
    p101 = [f for f in diagnose(result) if f.code == "P101"]
    assert p101 and p101[0].evidence["data_wait_fraction"] == pytest.approx(fraction, abs=1e-3)
    assert p101[0].location.path.endswith("slow_loader.py") and p101[0].location.line == line_of("slow_loader.py", "for x, y in loader")
    assert p101[0].evidence["max_speedup"] == pytest.approx(1 / (1 - fraction), rel=0.02)


def test_a_fast_loop_is_not_input_bound():
    # No loading cost, 60 ms of "compute": collating 8 tiny samples is a few % of the step.
    _, result = perf("slow_loader.py", "0", "0.06", warmup=2, steps=4)
    fraction = result.breakdown.fraction("data")
    assert fraction < 0.2
    assert not [f for f in diagnose(result) if f.code == "P101"]


def test_item_every_step_is_a_sync_only_on_the_accelerator():
    # On CPU, .item() is no host-device sync: nothing to report.
    _, plain = perf("item_every_step.py", warmup=2, steps=10)
    if not torch.cuda.is_available():
        assert plain.breakdown.syncs == 0
        assert not [f for f in diagnose(plain) if f.code == "P103"]
    # The stand-in: count CPU tensors as if they lived on the device.
    _, result = perf("item_every_step.py", warmup=2, steps=10, sync_device_types=frozenset({"cpu", "cuda"}))
    assert result.breakdown.syncs_per_step == pytest.approx(1.0)
    found = [f for f in diagnose(result) if f.code == "P103"]
    assert found and found[0].location.line == line_of("item_every_step.py", "loss.item()")
    assert found[0].evidence["kinds"] == {".item()": 10}


def test_perf_session_leaves_the_patient_alone():
    originals = {n: getattr(torch.Tensor, n) for n in ("item", "to", "cpu", "__bool__")}
    perf("item_every_step.py", warmup=1, steps=3, sync_device_types=frozenset({"cpu"}))
    assert {n: getattr(torch.Tensor, n) for n in originals} == originals
    assert torch.cuda.synchronize is not None


def test_plain_run_session_installs_no_perf_patch():
    from nndoctor.instrument.extensions import install

    original_item = torch.Tensor.item
    installation = install(Session(checks=[]))
    try:
        assert torch.Tensor.item is original_item
    finally:
        installation.uninstall()


def test_cli_writes_breakdown_and_loader_measurement(tmp_path, capsys):
    from nndoctor.cli import main

    out = tmp_path / "perf.json"
    code = main(["perf", "--steps", "6", "--warmup", "1", "--try", "loader", "--try-seconds", "0.3",
                 "--json", str(out), str(SCRIPTS / "slow_loader.py"), "0.003", "0.002"])
    assert code == 0
    data = json.loads(out.read_text())
    perf_data = data["extra"]["perf"]
    assert perf_data["breakdown"]["steps"] == 6
    loader = perf_data["trials"]["loader"]
    rates = {r["num_workers"]: r["samples_per_s"] for r in loader["results"] if r["prefetch_factor"] in (None, 2)}
    # Sleep-bound loading parallelises even on a busy machine: two workers beat one process.
    assert rates[2] > 1.3 * rates[0]
    assert loader["best"]["num_workers"] >= 2
    # The advice comes from the end-to-end timings (the loader's batches through a copy of the
    # script's own model, optimizer and loss); the grid stays as evidence.
    assert loader["measure"] == "end-to-end" and loader["best"] in loader["confirmed"]
    assert {c["num_workers"] for c in loader["confirmed"]} >= {0, loader["best"]["num_workers"]}
    assert all(c["batches_from_loader"] == c["steps"] > 0 for c in loader["confirmed"])
    codes = {f["code"] for f in data["findings"]}
    assert {"P101", "P102"} <= codes
    assert any(a["change"] == "loader" for a in perf_data["advice"])
    err = capsys.readouterr().err
    assert "data wait (DataLoader)" in err
    # While it runs, perf says what it is measuring.
    assert "nndoctor perf: running " in err and "1 warm-up optimizer steps, then timing 6" in err
    assert "nndoctor perf: timing DataLoader settings (about 0.3 s each)" in err
