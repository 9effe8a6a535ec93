"""L108 loss-at-chance: fires only with enough steps and evidence."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nndoctor.core.rules.chance_level import BatchOutcome, at_chance
from tests.conftest import BUGGY, run_script
from tests.frameworks.test_frameworks import _reset_accelerate

BUG = BUGGY / "L108_labels_shuffled_separately.py"
PROGRAMS = Path(__file__).parents[1] / "frameworks" / "programs"
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


PASSES_PROGRAM = '''
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(128, 8)
y = (x[:, 0] > 0).long()[torch.randperm(128)]  # labels permuted apart from the inputs
data = TensorDataset(x, y)
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
peek = next(iter(DataLoader(data, batch_size=8)))  # a batch looked at before training: no pass
for epoch in range(5):
    for xb, yb in DataLoader(data, batch_size=8, shuffle=True):  # a new DataLoader every epoch
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
    with torch.no_grad():  # an evaluation pass over the same samples: no training pass either
        for xb, yb in DataLoader(data, batch_size=32):
            F.cross_entropy(model(xb), yb)
'''


def test_passes_count_the_training_passes_over_each_dataset(tmp_path):
    script = tmp_path / "passes.py"
    script.write_text(PASSES_PROGRAM)
    report = run_script(script, select=["L108"])
    assert not report.internal_errors, report.internal_errors
    (finding,) = report.by_code("L108")
    # 16 steps a pass: the window ends with the second training pass, at step 31 (with the peek
    # or the evaluations counted as passes, it would end at step 15; per DataLoader, never).
    assert finding.evidence["passes"] == 2 and finding.evidence["to_step"] == 31
    assert finding.evidence["held_out_predictions"] == 4 * 128  # the evaluations after passes 2–5 (steps 32–80)
    assert "evaluations on held-out data after it stay at chance too" in finding.message


TWINS = {  # the Trainer programs with their bug undone: each learns, L108 must stay silent
    "buggy_hf_trainer_labels_permuted": (("labels = labels[torch.randperm(SAMPLES, generator=g)]", "pass"),),
    "buggy_hf_trainer_glue_shuffled_labels": (("rng.shuffle(texts)\n", "rng.shuffle(train)\n"),
                                              ("rng.shuffle(labels)", "texts, labels = [t for t, _ in train], [y for _, y in train]")),
}


@pytest.mark.slow  # seconds of Trainer on one thread
@pytest.mark.parametrize("program", sorted(TWINS))
def test_the_trainer_programs_with_their_labels_in_place_are_silent(program, tmp_path, monkeypatch):
    """At chance for a pass or two like the buggy programs, then they learn (the BERT one reaches
    72% in its second pass, the run_glue-style one 100% held-out accuracy after its first epoch)."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    for name, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
                        "CUDA_VISIBLE_DEVICES": "", "WANDB_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    source = (PROGRAMS / f"{program}.py").read_text()
    for bug, fix in TWINS[program]:
        assert bug in source
        source = source.replace(bug, fix)
    twin = tmp_path / f"{program}_fixed.py"
    twin.write_text(source)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = run_script(twin, select=["L108"])
    finally:
        torch.set_num_threads(threads)
        _reset_accelerate()
    assert report.status == "completed" and report.steps > 0
    assert not report.by_code("L108") and not report.internal_errors
