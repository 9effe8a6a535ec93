"""--try: the loader grid, its end-to-end confirmation and the step trials (on CPU)."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from nndoctor.commands.perf.torch.loader_trials import (
    confirm_candidates,
    loader_grid,
    step_batch,
    summarize_loader,
    try_loader,
)
from nndoctor.commands.perf.torch.step_trials import CapturedStep
from nndoctor.commands.perf.trials import parse_tries


def test_parse_tries():
    assert parse_tries(["loader,amp", "channels-last"]) == ("loader", "amp", "channels_last")
    assert "compile" in parse_tries(["all"])


def test_loader_grid_spans_workers_and_pinning():
    grid = loader_grid(16, True, {"num_workers": 0, "pin_memory": False})
    assert sorted({g["num_workers"] for g in grid}) == [0, 2, 4, 8, 12, 16]
    assert sorted({g["num_workers"] for g in loader_grid(8, True, {"num_workers": 0, "pin_memory": False})}) == [0, 2, 4, 6, 8]
    assert {g["pin_memory"] for g in grid} == {False, True}
    cpu_grid = loader_grid(2, False, {"num_workers": 3, "pin_memory": False})
    assert cpu_grid[0]["num_workers"] == 3  # the current setting is always measured
    assert sorted({g["num_workers"] for g in cpu_grid}) == [0, 2, 3]
    assert all(not g["pin_memory"] for g in cpu_grid)


def test_summarize_loader_picks_best_and_measures_against_current():
    results = [{"num_workers": 0, "pin_memory": False, "samples_per_s": 100.0},
               {"num_workers": 4, "pin_memory": False, "samples_per_s": 350.0}]
    summary = summarize_loader(results, {"num_workers": 0, "pin_memory": False})
    assert summary["best"]["num_workers"] == 4 and summary["speedup"] == 3.5


def test_time_loader_skips_prefetched_batches_and_copies_to_the_device():
    from torch.utils.data import DataLoader, TensorDataset

    from nndoctor.commands.perf.torch.loader_trials import time_loader

    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.arange(64)), batch_size=8)
    result = time_loader(loader, {"num_workers": 0, "pin_memory": False, "prefetch_factor": None},
                         seconds=0.2, max_batches=20, device="cpu")
    # A short epoch is timed whole (one epoch boundary, as in training): 8 batches.
    assert result["window"] == "one epoch" and result["batches"] == 8
    assert result["samples_per_s"] > 0 and result["startup_s"] >= 0
    # An epoch longer than the batch budget: time box, epochs would wrap.
    result = time_loader(loader, {"num_workers": 0, "pin_memory": False, "prefetch_factor": None},
                         seconds=0.2, max_batches=5, device="cpu")
    assert result["window"] == "time box" and result["batches"] == 5


def test_timing_window_takes_one_epoch_only_when_affordable():
    from nndoctor.commands.perf.torch.loader_trials import TimingWindow

    short = TimingWindow(per_epoch=40, seconds=1.0, fallback=30, min_count=5)
    assert not short.done(30, 0.8) and not short.done(39, 1.5)  # past the fallback, epoch affordable
    assert short.done(40, 1.6) and short.kind == "one epoch"
    long = TimingWindow(per_epoch=1000, seconds=1.0, fallback=30, min_count=5)
    assert not long.done(20, 0.9)
    assert long.done(25, 1.0) and long.kind == "time box"  # 40 s projected: gave up on the epoch
    unknown = TimingWindow(per_epoch=None, seconds=1.0, fallback=30, min_count=5)
    assert unknown.done(30, 0.1) and not unknown.done(4, 2.0) and unknown.done(5, 2.0)


def test_summarize_loader_takes_the_measured_best_even_when_unpinned():
    # No tie-break towards pinned memory: the loader-alone rate is what it is; pinning is
    # judged by the end-to-end confirmation.
    results = [{"num_workers": 8, "pin_memory": False, "samples_per_s": 1000.0},
               {"num_workers": 8, "pin_memory": True, "samples_per_s": 970.0}]
    assert summarize_loader(results, {"num_workers": 0, "pin_memory": False})["best"]["pin_memory"] is False


def test_confirm_candidates_two_best_per_pinning_and_current():
    grid = [
        {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "samples_per_s": 300.0},
        {"num_workers": 0, "pin_memory": True, "prefetch_factor": None, "samples_per_s": 360.0},
        {"num_workers": 8, "pin_memory": False, "prefetch_factor": 2, "samples_per_s": 1500.0},
        {"num_workers": 8, "pin_memory": True, "prefetch_factor": 2, "samples_per_s": 1800.0},
        {"num_workers": 12, "pin_memory": False, "prefetch_factor": 2, "samples_per_s": 2100.0},
        {"num_workers": 12, "pin_memory": True, "prefetch_factor": 2, "samples_per_s": 1700.0},
        {"num_workers": 16, "pin_memory": False, "prefetch_factor": 2, "samples_per_s": 2360.0},
        {"num_workers": 16, "pin_memory": True, "prefetch_factor": 2, "samples_per_s": 1880.0},
        {"num_workers": 16, "pin_memory": False, "prefetch_factor": 4, "samples_per_s": 2400.0},
    ]
    chosen = confirm_candidates(grid, {"num_workers": 0, "pin_memory": False})
    keys = [(c["num_workers"], c["pin_memory"], c["prefetch_factor"]) for c in chosen]
    # The current setting; the two best unpinned (16 with its fastest prefetch, then 12);
    # the two best pinned (16, 8).
    assert keys == [(0, False, None), (16, False, 4), (12, False, 2), (16, True, 2), (8, True, 2)]
    assert chosen[1]["loader_samples_per_s"] == 2400.0
    # The current setting is not timed twice when it is among the best.
    again = confirm_candidates(grid, {"num_workers": 16, "pin_memory": True})
    assert [(c["num_workers"], c["pin_memory"]) for c in again] == [(16, False), (12, False), (16, True), (8, True)]


def test_step_batch_matches_loader_tensors_to_the_captured_step_by_shape():
    captured_x, captured_y = torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.long)
    batch = [torch.ones(4, 3, 8, 8, dtype=torch.uint8), torch.arange(4)]
    (x,), y = step_batch(batch, (captured_x,), captured_y)
    assert x.dtype == torch.float32 and x.shape == captured_x.shape and float(x.sum()) == x.numel()
    assert torch.equal(y, torch.arange(4))
    # channels_last input in the user's loop: the loader's batch gets the same layout.
    cl = captured_x.contiguous(memory_format=torch.channels_last)
    (x,), _ = step_batch(batch, (cl,), captured_y)
    assert x.is_contiguous(memory_format=torch.channels_last)
    # A short last batch has no match: the caller trains on the captured batch instead.
    assert step_batch([torch.ones(3, 3, 8, 8), torch.arange(3)], (captured_x,), captured_y) is None


class SleepyDataset(Dataset):
    """Sleep-bound loading (parallelises in workers on any machine) of a tiny regression."""

    def __len__(self):
        return 96

    def __getitem__(self, index):
        time.sleep(0.003)
        return torch.full((6,), float(index % 7)), torch.tensor(index % 3)


def test_end_to_end_confirmation_advises_workers_and_leaves_the_user_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(SleepyDataset(), batch_size=8, shuffle=True)
    x, y = next(iter(loader))
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
    weights = [p.detach().clone() for p in model.parameters()]
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    step = CapturedStep(model, optimizer, nn.CrossEntropyLoss(), (x.clone(),), y.clone(), "cpu")
    started = time.perf_counter()
    result = try_loader(loader, {"num_workers": 0, "pin_memory": False}, cuda=False, seconds=0.25,
                        cpu_count=2, step=step, confirm_steps=8)
    assert time.perf_counter() - started < 10
    assert result["measure"] == "end-to-end", result.get("confirm_error")
    # The grid stays as evidence; the advice comes from the end-to-end timings.
    assert {r["num_workers"] for r in result["results"]} == {0, 2}
    confirmed = {c["num_workers"]: c for c in result["confirmed"]}
    assert set(confirmed) == {0, 2} and result["best"] is confirmed[2] and result["current"] is confirmed[0]
    # 24 ms of loading a batch in one process against 12 ms with two workers.
    assert result["speedup"] > 1.3
    for c in result["confirmed"]:
        assert c["steps"] >= 2 * 5 and c["batches_from_loader"] == c["steps"] and c["batches_captured"] == 0
    # Copies only: the user's weights, optimizer state and RNG are as they were.
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert all(torch.equal(a, optimizer.state[p]["momentum_buffer"]) for a, p in zip(momentum, model.parameters()))
    assert model.training and torch.equal(rng, torch.get_rng_state())


def test_step_runner_combines_variants_for_the_loader_confirmation():
    from nndoctor.commands.perf.torch.step_trials import StepRunner

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    runner = StepRunner("amp+channels_last", model, optimizer, nn.CrossEntropyLoss(),
                        (torch.randn(2, 3, 8, 8),), torch.tensor([0, 1]), "cpu")
    assert runner.parts == {"amp", "channels_last"}
    assert runner.model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert runner.inputs[0].is_contiguous(memory_format=torch.channels_last)
    assert not model[0].weight.is_contiguous(memory_format=torch.channels_last)  # the user's model untouched
    with runner.context():
        assert torch.is_autocast_enabled("cpu")


def test_a_step_change_hidden_by_the_data_wait_is_timed_end_to_end_at_the_best_loader_setting(monkeypatch):
    """The input-bound image patient: AMP is faster on the captured batch (compute only); at the
    loader's best setting its gain shows end to end, and the advice takes it, measured that way."""
    from types import SimpleNamespace

    from nndoctor.commands.perf.torch import captured_trials, loader_trials

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(SleepyDataset(), batch_size=8)
    x, y = next(iter(loader))
    step = CapturedStep(model, optimizer, nn.CrossEntropyLoss(), (x.clone(),), y.clone(), "cpu")
    rng = torch.get_rng_state()
    outcome = loader_trials.confirm_step_variant(loader, {"num_workers": 2, "pin_memory": False,
                                                          "prefetch_factor": 2}, step, "amp", seconds=0.2, rounds=2)
    assert outcome["variant"] == "amp" and len(outcome["rates"]["baseline"]) == len(outcome["rates"]["amp"]) == 2
    assert outcome["speedup"] == pytest.approx(outcome["variant_samples_per_s"] / outcome["baseline_samples_per_s"])
    assert torch.equal(rng, torch.get_rng_state())

    asked = []

    def fake(loader, setting, step, variant, **kw):
        asked.append(variant)
        return {"variant": variant, "setting": setting, "speedup": 1.4, "noise": 0.05, "pays_off": True}

    monkeypatch.setattr(loader_trials, "confirm_step_variant", fake)
    budget = SimpleNamespace(fits=lambda seconds: True, left=lambda: 100.0)
    best = {"num_workers": 12, "pin_memory": True, "prefetch_factor": 2}
    captured = {"winners": ["amp"], "changes": {"amp": {"speedup": 1.3, "pays_off": True}}}
    captured_trials.confirm_winners(captured, loader, {"best": best}, step, seconds=0.1, budget=budget)
    assert asked == ["amp"] and captured["end_to_end"]["speedup"] == 1.4 and captured["advice"] == "end to end"
    # Nothing faster on compute: nothing timed end to end.
    calm = {"winners": [], "changes": {"amp": {"speedup": 0.9, "pays_off": False}}}
    captured_trials.confirm_winners(calm, loader, {"best": best}, step, seconds=0.1, budget=budget)
    assert "end_to_end" not in calm and len(asked) == 1
