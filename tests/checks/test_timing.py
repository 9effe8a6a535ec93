"""Timing-based findings are warnings only when reproducible (clear margin in both halves)."""

from __future__ import annotations

import pytest

from nndoctor.checks._timing import TimeBuckets, share_in_halves, timing_severity
from nndoctor.core.findings import Severity
from tests.conftest import run_script


def test_share_in_halves():
    events = [(1.0, 0.5), (2.0, 0.5), (3.0, 0.1), (4.0, 0.1)]
    assert share_in_halves(events, 0.0, 4.0) == pytest.approx((0.5, 0.1))
    assert share_in_halves(events, 2.0, 2.0) is None


def test_time_buckets_give_the_halves_in_constant_memory():
    """P102 keeps when each DataLoader wait ended in buckets that merge as the run grows, not a
    list of every batch: the halves agree with the exact ones within one bucket (1/64 of the run)."""
    import random

    rng = random.Random(0)
    for duration in (0.5, 30.0, 5_000.0):  # shorter than the first buckets, a few merges, many
        start = 100.0
        events = sorted((start + rng.random() * duration, rng.random() * 0.01) for _ in range(20_000))
        buckets = TimeBuckets(start)
        for at, seconds in events:
            buckets.add(at, seconds)
        exact = share_in_halves(events, start, start + duration)
        approx = buckets.halves(start, start + duration)
        assert len(buckets.sums) == 64
        largest = max(buckets.sums) / (duration / 2)  # a half may gain or lose one bucket
        assert all(abs(a - e) <= largest + 1e-9 for a, e in zip(approx, exact, strict=True)), (approx, exact)
    assert TimeBuckets(0.0).halves(5.0, 5.0) is None


@pytest.mark.parametrize("overall, halves, expected", [
    (0.10, (0.1, 0.1), None),                  # below the threshold
    (0.22, (0.21, 0.23), Severity.INFO),       # past it, without the 1.5× margin
    (0.35, (0.05, 0.65), Severity.INFO),       # one half alone: a burst, not the run
    (0.35, (0.33, 0.37), Severity.WARNING),    # clear in both halves
    (0.50, None, Severity.INFO),               # no halves measured
])
def test_timing_severity(overall, halves, expected):
    assert timing_severity(overall, halves, 0.20) == expected


def test_a_clear_loader_bottleneck_on_the_cpu_is_hedged_info(tmp_path):
    script = tmp_path / "slow_loader.py"
    script.write_text(
        "import time, torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Decoded(Dataset):\n"
        "    def __len__(self): return 40\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.05)  # reading and decoding a large image\n"
        "        return torch.ones(4), 0\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in DataLoader(Decoded(), batch_size=4):\n"
        "    opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()\n"
    )
    found = run_script(script, select=["P102"]).by_code("P102")
    # No accelerator waits for the data: workers would compete with the CPU step for the cores,
    # so nndoctor names no speed-up and asks to measure (issue 28: 0 workers was the fastest).
    assert found and found[0].severity == Severity.INFO, [f.message for f in found]
    assert "No accelerator waits" in found[0].message and "faster or slower" in found[0].message
    assert "× faster" not in found[0].message and "max_speedup" not in found[0].evidence
    assert found[0].evidence["accelerator"] is False and "perf --try loader" in found[0].fix
    assert min(found[0].evidence["halves"]) >= 0.20


def _replay_loader(monkeypatch, waits: list[float], step_s: float, device: str = "cuda"):
    """Drive P102 with a fake clock: each step waits ``waits[i]`` for its batch, then computes
    (on ``device``: the optimizer's parameters live there)."""
    from types import SimpleNamespace

    from nndoctor.commands.perf import run_checks
    from nndoctor.core.engine import Session
    from nndoctor.core.step_log import LoaderTally

    clock = [0.0]
    monkeypatch.setattr(run_checks.time, "perf_counter", lambda: clock[0])
    session = Session(checks=[run_checks.LoaderConfig])
    check = session.checks[0]
    class Loader:  # weak-referenceable stand-in for a DataLoader
        num_workers = 0

    loader = Loader()
    parameter = SimpleNamespace(device=SimpleNamespace(type=device))
    step_end = SimpleNamespace(optimizer=SimpleNamespace(param_groups=[{"params": [parameter]}]), sampled=True)
    state = session.state

    def end_step():  # what the hook after optimizer.step() records, then its sampled event
        state.last_step_end = clock[0]
        if state.first_step_end is None:
            state.first_step_end = clock[0]
        state.step_ends += 1
        check.on_step_end(step_end)

    tally = LoaderTally()  # what the DataLoader hook adds each batch to (no event a batch)
    check.on_epoch_start(SimpleNamespace(loader=loader, location=None, tally=tally))
    end_step()
    for wait in waits:
        clock[0] += wait
        tally.wait += wait
        tally.batches += 1
        clock[0] += step_s
        end_step()
    check.on_run_end(SimpleNamespace(step=len(waits)))
    return session.report.by_code("P102")


def test_borderline_loader_wait_is_info(monkeypatch):
    # 25% overall: past the 20% threshold, not 1.5× clear of it.
    found = _replay_loader(monkeypatch, [0.01] * 40, 0.03)
    assert found and found[0].severity == Severity.INFO
    assert "Reported as info" in found[0].message


def test_a_burst_in_one_half_is_info(monkeypatch):
    # 41% overall, but nearly all of it in the first half of the run (78% and 5%).
    found = _replay_loader(monkeypatch, [0.08] * 12 + [0.001] * 60, 0.02)
    assert found and found[0].severity == Severity.INFO


def test_a_steady_bottleneck_is_a_warning(monkeypatch):
    found = _replay_loader(monkeypatch, [0.02] * 40, 0.02)
    assert found and found[0].severity == Severity.WARNING
    assert "at most 2.00× faster (an Amdahl bound" in found[0].message and "not a measurement" in found[0].message


def test_a_steady_bottleneck_without_an_accelerator_is_info_without_a_speedup(monkeypatch):
    found = _replay_loader(monkeypatch, [0.02] * 40, 0.02, device="cpu")
    assert found and found[0].severity == Severity.INFO
    assert "No accelerator waits" in found[0].message and "× faster" not in found[0].message
