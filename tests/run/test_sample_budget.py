"""The sampling budget: sampled steps that cost more than their share of the run's time are
spread out (100, 200, 400, ... steps apart), cheap ones keep the configured interval, and an
interval the user chose is never changed."""

from __future__ import annotations

import pytest
import torch

from nndoctor.core.engine import Session


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(session: Session, steps: int, *, step_s: float, sampled_extra_s: float,
          spike_at: int | None = None, cheap_from: int | None = None) -> list[int]:
    """Run ``steps`` optimizer steps on a clock that advances ``step_s`` per step, plus
    ``sampled_extra_s`` in each sampled step (half in the step, half in the next one, as the
    end-of-step handlers of a sampled step run after its step ended). The sampled steps."""
    clock = FakeClock()
    assert session.sample_budget is not None
    session.sample_budget.clock = clock
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sampled_steps, carry = [], 0.0
    for _ in range(steps):
        step = session.step
        if step == cheap_from:
            sampled_extra_s /= 20
        sampled = session.step_sampled(optimizer)
        clock.now += step_s + carry + (sampled_extra_s / 2 if sampled else 0.0)
        carry = sampled_extra_s / 2 if sampled else 0.0
        if step == spike_at:
            clock.now += 1.0  # a checkpoint written in this step
        if session.end_step(optimizer):
            sampled_steps.append(step)
    return sampled_steps


def periodic(steps: list[int], session: Session) -> list[int]:
    return [s for s in steps if s >= session.full_window]


def test_expensive_sampled_steps_are_spread_out_log_spaced_and_reported():
    # 2 ms steps, 20 ms per sampled step: 1 in 100 would cost 10 % of the run, the budget 1 %.
    session = Session(checks=[], sample_budget=0.01)
    sampled = drive(session, 7000, step_s=0.002, sampled_extra_s=0.020)
    assert periodic(sampled, session) == [100, 200, 400, 800, 1600, 3200, 4800, 6400]
    assert session.sample_every == 1600  # the cap: 16 × the configured interval
    summary = session.sample_budget.summary()
    assert [c["sample_every"] for c in summary["changes"]] == [200, 400, 800, 1600]
    assert [c["step"] for c in summary["changes"]] == [200, 400, 800, 1600]
    assert summary["sampled_step_cost_ms"][-1] == pytest.approx(20.0, abs=0.01)
    # What the user pays: 8 sampled steps' 20 ms over 7,000 steps of 2 ms: ≈ 1.1 %, was 10 %.
    assert len(periodic(sampled, session)) * 0.020 / (7000 * 0.002) < 0.012


def test_the_interval_stops_where_the_cost_fits_the_budget():
    # 2.5 ms per sampled step on 2 ms steps: 1 in 100 costs 1.25 %, 1 in 200 0.6 %.
    session = Session(checks=[], sample_budget=0.01)
    sampled = drive(session, 1300, step_s=0.002, sampled_extra_s=0.0025)
    assert periodic(sampled, session) == [100, 200, 400, 600, 800, 1000, 1200]
    assert session.sample_every == 200


def test_cheap_sampled_steps_keep_the_configured_interval():
    session = Session(checks=[], sample_budget=0.01)
    sampled = drive(session, 1000, step_s=0.100, sampled_extra_s=0.050)  # 0.5 % at 1 in 100
    assert periodic(sampled, session) == list(range(100, 1000, 100))
    assert session.sample_budget.changes == []


def test_one_slow_sampled_step_alone_does_not_widen_the_interval():
    session = Session(checks=[], sample_budget=0.01)
    sampled = drive(session, 700, step_s=0.100, sampled_extra_s=0.010, spike_at=300)
    assert periodic(sampled, session) == list(range(100, 700, 100))


def test_an_interval_the_user_chose_is_kept(monkeypatch):
    assert Session(checks=[], sample_every=100).sample_budget is None
    monkeypatch.setenv("NNDOCTOR_SAMPLE_EVERY", "100")
    assert Session(checks=[]).sample_budget is None
    monkeypatch.delenv("NNDOCTOR_SAMPLE_EVERY")
    monkeypatch.setenv("NNDOCTOR_SAMPLE_BUDGET", "0")
    assert Session(checks=[]).sample_budget is None
    monkeypatch.setenv("NNDOCTOR_SAMPLE_BUDGET", "0.05")
    budget = Session(checks=[]).sample_budget
    assert budget is not None and budget.budget == 0.05


def test_the_report_says_when_and_why_the_interval_widened():
    import io

    from nndoctor.core.findings import Report
    from nndoctor.report import print_report

    session = Session(checks=[], sample_budget=0.01)
    drive(session, 1000, step_s=0.002, sampled_extra_s=0.020)
    report = Report(command=["train.py"])
    report.status, report.extra["sampling"] = "completed", session.sample_budget.summary()
    out = io.StringIO()
    print_report(report, out)
    text = " ".join(out.getvalue().split())
    assert ("Sampled steps were spread out from step 200 (1 in 100 configured, 1 in 800 at most): "
            "a sampled step cost ≈ 20.0 ms") in text
    assert "may take 1% of the run" in text


def test_sampled_steps_that_became_cheap_narrow_the_interval_again():
    # The first sampled steps pay one-time costs (20 ms), later ones 1 ms: 1 in 100 fits again.
    session = Session(checks=[], sample_budget=0.01)
    sampled = drive(session, 6500, step_s=0.002, sampled_extra_s=0.020, cheap_from=1000)
    # Widening stops at 800 once a sampled step is cheap (step 1600), then the interval narrows
    # one halving at a time when the last three all fit twice over (3200, 3600, 4200).
    assert periodic(sampled, session)[:10] == [100, 200, 400, 800, 1600, 2400, 3200, 3600, 3800, 4000]
    assert periodic(sampled, session)[-3:] == [6200, 6300, 6400]
    assert session.sample_every == 100
    changes = session.sample_budget.summary()["changes"]
    assert [(c["step"], c["sample_every"]) for c in changes] == [
        (200, 200), (400, 400), (800, 800), (3200, 400), (3600, 200), (4200, 100)]
