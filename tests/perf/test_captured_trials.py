"""Issue 29: on an input-bound loop the step changes are judged on the captured batch (compute
only), the winners confirmed end to end at the loader's best setting, and advised accordingly."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from nndoctor.commands.perf.render import captured_lines
from nndoctor.commands.perf.torch import captured_trials
from nndoctor.commands.perf.torch.diagnosis import captured_step_advice
from nndoctor.commands.perf.torch.step_trials import CapturedStep

SCRIPTS = Path(__file__).parent / "scripts"


class SleepyNet(nn.Module):
    """Compute stand-ins: NCHW input costs ``nchw_s`` (removed by channels_last), autocast
    ``autocast_s`` more (a change slower on compute)."""

    def __init__(self, nchw_s: float, autocast_s: float) -> None:
        super().__init__()
        self.nchw_s, self.autocast_s = nchw_s, autocast_s
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 8 * 8, 4))

    def forward(self, x):
        time.sleep(0.003)
        if not x.is_contiguous(memory_format=torch.channels_last):
            time.sleep(self.nchw_s)
        if torch.is_autocast_enabled("cpu"):
            time.sleep(self.autocast_s)
        return self.body(x)


def _step(nchw_s: float, autocast_s: float) -> CapturedStep:
    torch.manual_seed(0)
    model = SleepyNet(nchw_s, autocast_s)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return CapturedStep(model, optimizer, nn.CrossEntropyLoss(), (torch.randn(4, 3, 8, 8),),
                        torch.tensor([0, 1, 2, 3]), "cpu")


def test_a_change_faster_on_compute_wins_and_one_slower_does_not(monkeypatch):
    monkeypatch.setattr(captured_trials, "TIMING_S", 0.02)
    step = _step(nchw_s=0.015, autocast_s=0.01)
    weights = [p.detach().clone() for p in step.model.parameters()]
    rng, benchmark = torch.get_rng_state(), torch.backends.cudnn.benchmark
    out = captured_trials.time_captured_changes(step, ["amp", "channels_last"], compute_s=0.02, repeats=3,
                                                warmup=1)
    cl, amp = out["changes"]["channels_last"], out["changes"]["amp"]
    # 18 ms against 3 ms a step (plus the tiny convolution): far beyond any timing noise.
    assert cl["pays_off"] and cl["speedup"] > 2 and cl["loss_ok"] and cl["measure"] == "captured batch"
    assert not amp["pays_off"] and amp["speedup"] < 1
    assert out["winners"] == ["channels_last"] and out["together"] is None
    # Copies only: the user's weights, optimizer, RNG and global flags are as they were.
    assert all(torch.equal(a, b) for a, b in zip(weights, step.model.parameters()))
    assert not step.optimizer.state and torch.equal(rng, torch.get_rng_state())
    assert torch.backends.cudnn.benchmark == benchmark and not torch.is_autocast_enabled("cpu")


def test_a_change_no_faster_on_compute_is_not_a_winner(monkeypatch):
    monkeypatch.setattr(captured_trials, "TIMING_S", 0.02)
    out = captured_trials.time_captured_changes(_step(nchw_s=0.0, autocast_s=0.02), ["amp"], compute_s=0.01,
                                                repeats=3, warmup=1)
    assert not out["changes"]["amp"]["pays_off"] and out["winners"] == []
    assert captured_trials.decide(out, None) is None
    assert captured_step_advice({"captured_step": out}, []) == []
    assert "none faster on compute: none advised" in "\n".join(captured_lines(out))


def _captured(e2e: dict | None, advice: str) -> dict:
    verdict = {"speedup": 1.45, "noise": 0.02, "pays_off": True, "loss_ok": True, "loss_change": 0.001,
               "base_s": 0.036, "variant_s": 0.025, "measure": "captured batch"}
    return {"measure": "captured batch", "steps": 7, "repeats": 5,
            "changes": {"amp": {**verdict, "speedup": 1.09}, "channels_last": verdict},
            "together": {"changes": ["amp", "channels_last"], "speedup": 1.6, "noise": 0.02, "pays_off": True},
            "winners": ["amp", "channels_last"], "end_to_end": e2e, "advice": advice}


SETTING = {"num_workers": 12, "pin_memory": True, "prefetch_factor": 2}


@pytest.mark.parametrize(("e2e", "expected"), [
    ({"speedup": 1.3, "noise": 0.04, "pays_off": True}, "end to end"),
    ({"speedup": 1.01, "noise": 0.04, "pays_off": False}, "step only"),
    ({"speedup": 0.85, "noise": 0.04, "pays_off": False}, "slower end to end"),
    ({"not_measured": "budget"}, "step only"),
    (None, "step only"),
])
def test_the_end_to_end_timing_decides_how_the_winners_are_advised(e2e, expected):
    assert captured_trials.decide({"winners": ["amp"]}, e2e) == expected


def test_winners_confirmed_end_to_end_are_advised_with_the_loader_as_one_combination():
    e2e = {"variant": "amp+channels_last", "setting": SETTING, "speedup": 1.35, "noise": 0.03, "pays_off": True,
           "baseline_samples_per_s": 1500.0, "variant_samples_per_s": 2025.0, "rounds": 3}
    trials = {"captured_step": _captured(e2e, "end to end"),
              "loader": {"best": SETTING, "current": {"samples_per_s": 300.0}, "speedup": 6.0}}
    items = captured_step_advice(trials, [{"change": "loader"}, {"change": "fewer-syncs"}])
    assert [i["change"] for i in items] == ["amp", "channels_last", "combination"]
    assert items[1]["end_to_end_speedup"] == 1.35 and "compute only" in items[1]["measured_as"]
    combo = items[2]
    assert combo["changes"] == ["loader", "amp", "channels_last"] and combo["measured_speedup"] == pytest.approx(6.75)
    assert "2025 samples/s" in combo["measured_as"] and combo["step_speedup"] == 1.6
    text = "\n".join(captured_lines(trials["captured_step"]))
    assert "1500.0 → 2025.0 samples/s, 1.35×" in text and "advised with the loader" in text


def test_winners_the_loader_still_hides_are_advised_as_gains_once_it_keeps_up():
    e2e = {"variant": "amp+channels_last", "setting": SETTING, "speedup": 1.01, "noise": 0.05, "pays_off": False,
           "baseline_samples_per_s": 1500.0, "variant_samples_per_s": 1515.0, "rounds": 3}
    trials = {"captured_step": _captured(e2e, "step only"), "loader": {"best": SETTING}}
    items = captured_step_advice(trials, [{"change": "loader"}])
    assert [i["change"] for i in items] == ["amp", "channels_last"]  # no end-to-end combination claimed
    for item in items:
        assert item["gains"].startswith("once the input pipeline keeps up: measured on the step, not end to end")
        assert "loader still bounds the loop: 1.01× end to end" in item["gains"] and "end_to_end_speedup" not in item
    assert "gains once the input pipeline keeps up" in "\n".join(captured_lines(trials["captured_step"]))
    # Slower end to end: not advised at all.
    e2e_slow = {**e2e, "speedup": 0.8}
    assert captured_step_advice({"captured_step": _captured(e2e_slow, "slower end to end")}, []) == []


@pytest.mark.slow
def test_input_bound_convnet_advice_has_the_loader_and_the_change_faster_on_compute(monkeypatch):
    """Whole perf run (in process): the loop waits for data; channels_last removes 20 ms of a
    22 ms step, autocast adds 10 ms. The advice: the loader and channels_last, never amp."""
    from nndoctor.commands.perf.config import PerfConfig
    from nndoctor.commands.perf.session import run_perf
    from nndoctor.commands.perf.torch.diagnosis import advice
    from nndoctor.run.runner import Target

    monkeypatch.setattr(captured_trials, "TIMING_S", 0.05)
    lines: list[str] = []
    _, result = run_perf(Target(str(SCRIPTS / "input_bound_convnet.py"), []),
                         PerfConfig(warmup=2, steps=6, tries=("loader", "amp", "channels_last"), try_seconds=0.2,
                                    budget=120.0), announce=lines.append)
    trials = result.trials
    captured = trials["captured_step"]
    assert trials["step_timing"]["excludes_data_wait"] and trials["step_timing"]["data_share"] >= 0.5
    assert captured["changes"]["channels_last"]["pays_off"] and not captured["changes"]["amp"]["pays_off"]
    assert captured["winners"] == ["channels_last"]
    # No re-run of the script: both changes were timed in this process.
    assert "baseline" not in trials and trials["amp"]["measure"] == "captured batch"
    # The loader was confirmed against the step the advice will have.
    assert trials["loader"]["step_variant"] == "channels_last"
    items = {item["change"]: item for item in advice(result)}
    assert "loader" in items and "channels_last" in items and "amp" not in items
    e2e = captured["end_to_end"]
    assert e2e.get("speedup"), e2e
    if captured["advice"] == "end to end":
        assert items["channels_last"]["end_to_end_speedup"] == e2e["speedup"] and e2e["pays_off"]
    else:
        assert captured["advice"] == "step only" and "once the input pipeline keeps up" in items["channels_last"]["gains"]
    assert any("on the captured batch" in line for line in lines)
    assert trials["budget"]["used_s"] <= 120.0


def test_an_interruption_during_the_captured_batch_timing_keeps_a_report(monkeypatch):
    """Ctrl-C / SIGTERM while the changes are timed in process: the report still comes, the
    changes say `not measured (interrupted)`, and nothing after them starts."""
    from nndoctor.commands.perf.config import PerfConfig
    from nndoctor.commands.perf.session import run_perf
    from nndoctor.run.runner import Target

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(captured_trials, "time_captured_changes", interrupted)
    _, result = run_perf(Target(str(SCRIPTS / "input_bound_convnet.py"), []),
                         PerfConfig(warmup=1, steps=4, tries=("loader", "amp", "channels_last"), budget=60.0))
    trials = result.trials
    assert trials["interrupted"].startswith("interrupted")
    assert trials["amp"]["not_measured"] == trials["channels_last"]["not_measured"] == "interrupted"
    assert "loader" not in trials and "captured_step" not in trials
    assert result.breakdown.steps == 4


def test_the_end_to_end_step_feeds_loaded_batches_in_the_variants_memory_format():
    """The advised loop converts each batch it loads; a channels_last step fed NCHW batches in the
    end-to-end timing would pay the layout cost the change removes, and hide its gain."""
    from nndoctor.commands.perf.torch.step_trials import StepRunner

    seen: list[bool] = []

    class Recorder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 2, 3)

        def forward(self, x):
            seen.append(x.is_contiguous(memory_format=torch.channels_last))
            return self.conv(x).mean((2, 3))

    model = Recorder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch, target = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    for variant, expected in (("channels_last", True), ("amp+channels_last", True), ("baseline", False)):
        StepRunner(variant, model, optimizer, nn.CrossEntropyLoss(), (batch,), target, "cpu").run((batch,), target)
        assert seen.pop() is expected, variant
    assert batch.is_contiguous()  # the loaded batch itself is not changed


def test_a_larger_batch_on_an_input_bound_loop_is_judged_with_its_data_wait():
    """On an input-bound loop the re-runs time the step without the data wait; a batch twice as
    large also waits twice as long for data, so samples/s counts the wait (else 2× the batch of a
    loop that only loads would look 2× faster)."""
    from nndoctor.commands.perf.combine import seconds_per_unit
    from nndoctor.commands.perf.rerun import summarize_batch_sizes

    base = {"seconds_per_step": 0.010, "wall_seconds_per_step": 0.050, "samples_per_step": 8}
    double = {"seconds_per_step": 0.010, "wall_seconds_per_step": 0.110, "samples_per_step": 16,
              "applied": ["batch_size 8 → 16"]}
    assert seconds_per_unit([base], per_sample=True) == [pytest.approx(0.050 / 8)]
    assert seconds_per_unit([base], per_sample=False) == [0.010]  # step changes: without the wait
    summary = summarize_batch_sizes({"baseline": [base, base], "batch-size=2": [double, double]}, (2,))
    two = summary["sizes"][1]
    # 16 samples in 110 ms against 8 in 50 ms: slower, though its step without the wait is 2× per sample.
    assert two["samples_per_s"] == pytest.approx(16 / 0.110) and summary["sizes"][0]["samples_per_s"] == pytest.approx(160)
    assert summary["best"]["factor"] == 1 and not summary["pays_off"]
    # Outside an input-bound loop a re-run has no separate wall time: unchanged.
    assert seconds_per_unit([{"seconds_per_step": 0.02, "samples_per_step": 4}]) == [pytest.approx(0.005)]
