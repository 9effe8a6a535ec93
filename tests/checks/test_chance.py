"""L108 loss-at-chance: fires only with enough steps and evidence."""

from __future__ import annotations

from nndoctor.checks.chance import Observation, at_chance, entropy
from tests.conftest import BUGGY, run_script

BUG = BUGGY / "L108_labels_shuffled_separately.py"


def _obs(losses, steps=(100, 200, 300), correct=28):
    return [Observation(s, v, correct, 100) for s, v in zip(steps, losses)]


def test_entropy_of_a_uniform_prior_is_ln_c():
    assert abs(entropy([5, 5, 5, 5]) - 1.3863) < 1e-3


def test_at_chance_needs_the_window_and_the_level():
    counts = [25, 25, 25, 25]
    assert at_chance(_obs([1.39, 1.38, 1.39]), counts) is not None
    assert at_chance(_obs([1.39, 1.38]), counts) is None  # too few observations
    assert at_chance(_obs([1.39, 1.38, 1.39], steps=(60, 100, 150)), counts) is None  # too short a span
    assert at_chance(_obs([1.39, 1.38, 1.39], steps=(0, 5, 10)), counts) is None  # burn-in only
    assert at_chance(_obs([1.2, 1.0, 0.8]), counts) is None  # learning
    assert at_chance(_obs([1.39, 1.38, 1.39], correct=60), counts) is None  # above the majority rate


def test_skewed_prior_uses_its_entropy():
    counts = [90, 10]  # H = 0.325, ln 2 = 0.693
    assert at_chance(_obs([0.33, 0.32, 0.33], correct=90), counts) is not None
    assert at_chance(_obs([0.10, 0.09, 0.08], correct=97), counts) is None


def test_the_same_program_with_one_permutation_is_silent(tmp_path):
    fixed = tmp_path / "aligned.py"
    source = BUG.read_text()
    assert "X = X[torch.randperm(len(X))]" in source and "y = y[torch.randperm(len(y))]" in source
    fixed.write_text(source.replace("X = X[torch.randperm(len(X))]", "perm = torch.randperm(len(X))")
                     .replace("y = y[torch.randperm(len(y))]", "X, y = X[perm], y[perm]"))
    report = run_script(fixed, select=["L108"])
    assert report.status == "completed" and report.steps == 320
    assert not report.by_code("L108")


def test_a_short_run_is_not_judged():
    report = run_script(BUGGY / "L106_labels_independent_of_inputs.py", select=["L108"])
    assert not report.by_code("L108")
