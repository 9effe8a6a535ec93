"""L108 loss-at-chance: fires only with enough steps and evidence."""

from __future__ import annotations

from nndoctor.chance_level import BatchOutcome, at_chance
from tests.conftest import BUGGY, run_script

BUG = BUGGY / "L108_labels_shuffled_separately.py"
# The sequential rule itself (early decisions, learning models, short runs, the loss-only case,
# the bounds) is tested in test_chance_level.py; here: a skewed prior, and whole programs.


def test_skewed_prior_uses_its_entropy():
    counts = [700, 300]  # H(y) = 0.611, ln 2 = 0.693; majority rate 0.7
    at_majority = [BatchOutcome(step, 0.62, 22, 32) for step in range(20, 100)]  # 68.8% ≈ the majority rate
    assert at_chance(at_majority, counts)["prior_entropy"] == 0.6109
    learned = [BatchOutcome(step, 0.2, 22, 32) for step in range(20, 100)]  # loss far below H(y)
    assert at_chance(learned, counts) is None


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
