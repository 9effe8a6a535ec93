"""Step counting: per optimizer and per iteration (layer-wise phases), closures, hand-written
updates, and the every-step checks (a bug that starts at step 50 is seen at step 50)."""

from __future__ import annotations

import pytest

from tests.conftest import CORRECT, FIXTURES, run_script

SCRIPTS = FIXTURES / "scripts"


def test_a_second_optimizer_keeps_counting_and_meets_max_steps():
    report = run_script(CORRECT / "layerwise_phases.py", max_steps=60)
    assert report.status == "stopped" and report.steps == 60


def test_every_phase_of_layerwise_training_is_counted():
    report = run_script(CORRECT / "layerwise_phases.py")
    # 3 phases of 40 steps; a new optimizer's first step joins the previous iteration.
    assert report.status == "completed" and 117 <= report.steps <= 120


def test_a_new_optimizer_is_sampled_from_its_first_step():
    from nndoctor.core.engine import Session

    class Opt:  # stand-ins: only identity matters to the counters
        pass

    session = Session(checks=[], full_window=4, sample_every=1000)
    first, second = Opt(), Opt()
    for _ in range(10):
        session.count_step(first)
    assert not session.sampled and not session.step_sampled(first)
    assert session.step_sampled(second)
    session.count_step(second)
    assert session.sampled and session.step == 10
    session.count_step(second)
    assert session.step == 11 and session.state.step_counts[second] == 2


def test_gan_iterations_count_once():
    report = run_script(CORRECT / "gan_two_optimizers.py")
    plain_iterations = report.steps
    assert report.status == "completed" and plain_iterations > 0
    stopped = run_script(CORRECT / "gan_two_optimizers.py", max_steps=3)
    assert stopped.status == "stopped" and stopped.steps == 3


@pytest.mark.parametrize("style", ["data", "no_grad"])
def test_hand_written_updates_are_steps(style):
    report = run_script(SCRIPTS / "manual_sgd.py", [style])
    assert report.status == "completed" and report.steps >= 29
    assert not report.by_code("R105")
    stopped = run_script(SCRIPTS / "manual_sgd.py", [style], max_steps=10)
    assert stopped.status == "stopped" and stopped.steps == 10


@pytest.mark.parametrize("style", ["data", "no_grad"])
def test_hand_written_updates_are_observed_without_changing_them(tmp_path, style):
    """Observer rule for the detector: bit-identical weights and RNG with and without it."""
    import runpy
    import sys

    import torch

    plain, doctored = tmp_path / "plain.pt", tmp_path / "doctored.pt"
    saved = sys.argv[:]
    sys.argv = [str(SCRIPTS / "manual_sgd.py"), style, str(plain)]
    try:
        runpy.run_path(str(SCRIPTS / "manual_sgd.py"), run_name="__main__")
    finally:
        sys.argv = saved
    report = run_script(SCRIPTS / "manual_sgd.py", [style, str(doctored)])
    assert report.status == "completed"
    a, b = torch.load(plain), torch.load(doctored)
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
    assert torch.equal(a["next_draw"], b["next_draw"])


@pytest.mark.parametrize("bug, code", [
    ("no_backward", "O103"),
    ("lr_zero", "M106"),
    ("stale_model", "M106"),
    ("stale_model", "O103"),
])
def test_a_bug_that_starts_at_step_50_is_seen_when_it_starts(bug, code):
    report = run_script(SCRIPTS / "late_bug.py", [bug], select=[code])
    found = report.by_code(code)
    assert found, (bug, code, report.findings, report.internal_errors)
    # O103 at the step the bug starts; M106 after its 10-step streak (sampled steps alone
    # would need 5 sampled steps: step 500).
    assert 50 <= found[0].first_step <= 61, found[0].first_step
    assert not report.internal_errors


@pytest.mark.parametrize("bug, code, within", [
    ("no_backward", "O103", 0),  # the step without backward() wakes the settled check at once
    ("stale_model", "O103", 0),  # so does the new model's first training forward
    ("stale_model", "M106", 11),
    ("lr_zero", "M106", 100 + 11),  # unseen by the hooks: the next sampled step wakes it
])
def test_a_bug_that_starts_after_the_checks_settled_is_seen(bug, code, within):
    """M106 and O103 judge every step only until the loop has settled (64 clean steps), then
    on sampled steps: a bug that starts at step 300 is still found at once, or within the
    next sampled interval and M106's streak of 10 when no hook sees the change."""
    report = run_script(SCRIPTS / "late_bug.py", [bug, "300", "420"], select=[code])
    found = report.by_code(code)
    assert found, (bug, code, report.findings, report.internal_errors)
    assert 300 <= found[0].first_step <= 300 + within, found[0].first_step
    assert not report.internal_errors


def test_no_late_finding_without_the_bug():
    report = run_script(SCRIPTS / "late_bug.py", ["none"], select=["O103", "M106"])
    assert not report.findings and report.steps == 80


def test_end_step_is_step_sampled_then_count_step():
    """The optimizer hook's one-unwrap ``end_step`` answers and counts as the two calls did,
    through a single optimizer, a GAN's alternating pair and a new phase's optimizer."""
    import torch as _torch

    from nndoctor.core.engine import Session as _Session

    params = [_torch.nn.Parameter(_torch.zeros(1)) for _ in range(3)]
    a, b, c = (_torch.optim.SGD([p], lr=0.1) for p in params)
    order = [a] * 30 + [a, b] * 20 + [c] * 40 + [a, c] * 5
    old, new = _Session(checks=[], full_window=4, sample_every=7), _Session(checks=[], full_window=4, sample_every=7)
    for optimizer in order:
        before = old.step_sampled(optimizer)
        old.count_step(optimizer)
        assert new.end_step(optimizer) == before
        assert (new.step, new._phase_sampled, new.state.total_steps) == (old.step, old._phase_sampled,
                                                                         old.state.total_steps)
    assert dict(new.state.step_counts) == dict(old.state.step_counts)
