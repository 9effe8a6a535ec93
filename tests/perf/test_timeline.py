"""The breakdown arithmetic (pure functions)."""
from __future__ import annotations

import pytest

from nndoctor.commands.perf.timeline import (
    StepRecord,
    amdahl_speedup,
    relative_noise,
    speedup_verdict,
    summarize,
)


def record(step, wall, **phases):
    r = StepRecord(step=step, wall=wall)
    r.phases.update(phases)
    return r


def test_summarize_adds_phases_and_other():
    records = [record(1, 0.10, data=0.04, forward=0.02), record(2, 0.10, data=0.02, backward=0.03)]
    records[0].samples = records[1].samples = 8
    records[1].syncs = 3
    b = summarize(records)
    assert b.steps == 2 and b.wall == pytest.approx(0.20)
    assert b.phases["data"] == pytest.approx(0.06)
    assert b.phases["other"] == pytest.approx(0.04 + 0.05)
    assert b.fraction("data") == pytest.approx(0.3)
    assert b.samples_per_s == pytest.approx(16 / 0.2)
    assert b.syncs_per_step == pytest.approx(1.5)
    assert b.gpu_busy_fraction is None


def test_gpu_busy_only_over_steps_that_have_events():
    records = [record(1, 0.1), record(2, 0.3)]
    records[1].gpu_busy = 0.06
    assert summarize(records).gpu_busy_fraction == pytest.approx(0.2)


def test_other_never_negative_when_phases_overlap_rounding():
    assert record(1, 0.01, forward=0.02).other == 0.0


def test_amdahl():
    assert amdahl_speedup(0.5) == pytest.approx(2.0)
    assert amdahl_speedup(0.0) == 1.0


def test_verdict_needs_gain_beyond_noise():
    base = [1.00, 1.02, 0.98]
    assert speedup_verdict(base, [0.50, 0.51, 0.49])["pays_off"]
    assert not speedup_verdict(base, [0.99, 0.97, 1.01])["pays_off"]  # within the 4% spread
    noisy = speedup_verdict([1.0, 2.0, 1.5], [1.2, 1.1, 1.3])
    assert noisy["noise"] == pytest.approx(1.0 / 1.5) and not noisy["pays_off"]
    assert relative_noise([1.0]) == 0.0
