"""--try: the loader grid and the step trials (on CPU with a tiny conv net)."""
from __future__ import annotations

import torch
import torch.nn as nn

from nndoctor.perf.trials import loader_grid, parse_tries, summarize_loader, try_steps


def test_parse_tries():
    assert parse_tries(["loader,amp", "channels-last"]) == ("loader", "amp", "channels_last")
    assert "compile" in parse_tries(["all"])


def test_loader_grid_spans_workers_and_pinning():
    grid = loader_grid(16, True, {"num_workers": 0, "pin_memory": False})
    assert sorted({g["num_workers"] for g in grid}) == [0, 2, 4, 8, 16]
    assert {g["pin_memory"] for g in grid} == {False, True}
    cpu_grid = loader_grid(2, False, {"num_workers": 3, "pin_memory": False})
    assert cpu_grid[0]["num_workers"] == 3  # the current setting is always measured
    assert all(not g["pin_memory"] for g in cpu_grid)


def test_summarize_loader_picks_best_and_measures_against_current():
    results = [{"num_workers": 0, "pin_memory": False, "samples_per_s": 100.0},
               {"num_workers": 4, "pin_memory": False, "samples_per_s": 350.0}]
    summary = summarize_loader(results, {"num_workers": 0, "pin_memory": False})
    assert summary["best"]["num_workers"] == 4 and summary["speedup"] == 3.5


def test_step_trials_time_each_variant_and_check_the_loss():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))
    rng_before = torch.get_rng_state()
    results = try_steps(("amp", "channels_last", "cudnn-benchmark"), model, optimizer, nn.CrossEntropyLoss(),
                        (x,), y, device="cpu", repeats=2, steps=2, warmup=1)
    for name in ("amp", "channels_last"):
        r = results[name]
        assert r["speedup"] > 0 and len(r["times_s"]) == 2
        assert r["loss_ok"], r  # bf16 within 5%, channels_last within 1%
    assert results["channels_last"]["loss_change"] < 1e-4
    assert 0 < results["amp"]["loss_change"] < 0.05  # bf16 changes it, a little
    assert "skipped" in results["cudnn-benchmark"]
    # The trials ran on copies: the user's weights and RNG are untouched.
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert torch.equal(rng_before, torch.get_rng_state())


def test_time_loader_skips_prefetched_batches_and_copies_to_the_device():
    from torch.utils.data import DataLoader, TensorDataset

    from nndoctor.perf.trials import time_loader

    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.arange(64)), batch_size=8)
    result = time_loader(loader, {"num_workers": 0, "pin_memory": False, "prefetch_factor": None},
                         seconds=0.2, max_batches=20, device="cpu")
    # Epochs wrap inside one timing: 20 batches from an 8-batch dataset.
    assert result["batches"] == 20 and result["samples_per_s"] > 0 and result["startup_s"] >= 0


def test_summarize_loader_prefers_pinned_memory_within_the_noise_of_the_best():
    results = [
        {"num_workers": 0, "pin_memory": False, "samples_per_s": 100.0},
        {"num_workers": 8, "pin_memory": False, "samples_per_s": 1000.0},
        {"num_workers": 8, "pin_memory": True, "samples_per_s": 970.0},
    ]
    assert summarize_loader(results, {"num_workers": 0, "pin_memory": False})["best"]["pin_memory"] is True
    results[2]["samples_per_s"] = 800.0  # clearly slower: the measurement wins
    assert summarize_loader(results, {"num_workers": 0, "pin_memory": False})["best"]["pin_memory"] is False
