"""D111, L109, P112, L107: decision functions and silent cases."""

from __future__ import annotations

import textwrap

from nndoctor.checks.evaluation import overfitting_verdict
from nndoctor.checks.labels import balancing_weights, collapse_verdict, imbalance_ratio
from tests.conftest import run_script


def test_imbalance_ratio_over_the_classes_seen():
    assert imbalance_ratio([900, 80, 20]) == (45.0, 0, 2)
    assert imbalance_ratio([0, 50, 0]) is None                 # one class seen: nothing to compare
    assert imbalance_ratio([0, 30, 10]) == (3.0, 1, 2)


def test_balancing_weights_are_sklearn_balanced():
    assert balancing_weights([900, 80, 20]) == [0.37, 4.167, 16.667]
    assert balancing_weights([5, 0]) == [0.5, 0.0]


def test_collapse_needs_every_batch_dominated_by_the_same_over_predicted_class():
    collapsed = [([8, 8, 8, 8], [32, 0, 0, 0])] * 6
    assert collapse_verdict(collapsed) == (0, 1.0, 0.25)
    one_batch_mixed = collapsed[:5] + [([8, 8, 8, 8], [20, 12, 0, 0])]
    assert collapse_verdict(one_batch_mixed) is None
    alternating = [([8, 8, 8, 8], [32, 0, 0, 0]), ([8, 8, 8, 8], [0, 32, 0, 0])] * 3
    assert collapse_verdict(alternating) is None
    skewed_targets = [([30, 1, 1, 0], [32, 0, 0, 0])] * 6    # the data are 94% class 0
    assert collapse_verdict(skewed_targets) is None
    assert collapse_verdict(collapsed[:2]) is None             # too few predictions


def test_overfitting_verdict_needs_a_trend_on_both_curves():
    rising = [(1.0, 1.0), (0.8, 1.05), (0.6, 1.1), (0.4, 1.2)]
    verdict = overfitting_verdict(rising)
    assert verdict and verdict["rise_above_best"] == 0.2
    assert overfitting_verdict(rising[:3]) is None
    assert overfitting_verdict([(1.0, 1.0), (0.8, 1.01), (0.6, 1.02), (0.4, 1.03)]) is None   # < 10%
    assert overfitting_verdict([(1.0, 1.0), (0.8, 1.05), (0.6, 1.04), (0.4, 1.2)]) is None    # not each time
    assert overfitting_verdict([(1.0, 1.0), (1.1, 1.05), (1.2, 1.1), (1.3, 1.2)]) is None     # diverging
    assert overfitting_verdict([(1.0, 1.0), (0.8, 1.1), (0.6, float("nan")), (0.4, 1.2)]) is None


def test_a_logged_no_grad_metric_per_step_is_not_an_evaluation(tmp_path):
    script = tmp_path / "metric.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Linear(8, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
        for step in range(40):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            with torch.no_grad():   # a noisy metric on a random batch, once per step
                nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,)))
    """))
    report = run_script(script, select=["L107"])
    assert not report.findings and not report.internal_errors


def test_eval_mode_forwards_followed_by_backward_are_training(tmp_path):
    script = tmp_path / "eval_mode_training.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.eval()                      # frozen BatchNorm statistics, on purpose
        for step in range(8):
            opt.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 2, (16,))).backward()
            opt.step()
    """))
    report = run_script(script, select=["P112"])
    assert not report.findings and not report.internal_errors


def test_worker_duplicates_must_cross_workers_and_never_repeat_within_one():
    import torch

    from nndoctor.checks.data_workers import WorkerDuplicates, batch_fingerprint

    batches = [torch.full((4, 2), float(i)) for i in range(6)]
    unsharded = WorkerDuplicates(workers=2)
    for index in range(12):                           # worker 0 and worker 1 both yield 0, 1, 2, …
        unsharded.add(batch_fingerprint(batches[index // 2]), index)
    assert unsharded.verdict() and unsharded.cross_worker == 6

    constant = WorkerDuplicates(workers=2)
    for index in range(12):                           # the data itself repeats
        constant.add(batch_fingerprint(batches[0]), index)
    assert not constant.verdict()

    sharded = WorkerDuplicates(workers=2)
    for index in range(6):
        sharded.add(batch_fingerprint(batches[index]), index)
    assert not sharded.verdict()
    assert batch_fingerprint(batches[1]) != batch_fingerprint(batches[1].double())
    assert batch_fingerprint({"text": "no tensor"}) is None


def test_memory_growth_verdict_wants_a_steady_rise():
    from nndoctor.checks.memory_growth import MemorySample, growing_containers, growth_verdict

    mb = 2**20

    def series(values, start=3):
        return [MemorySample(step=start + i, bytes=int(v * mb)) for i, v in enumerate(values)]

    assert growth_verdict(series([10, 11, 12, 13, 14, 15])) == mb
    assert growth_verdict(series([10, 11, 12, 13, 14])) is None                   # too few samples
    assert growth_verdict(series([10, 10.1, 10.2, 10.3, 10.4, 10.5])) is None     # 0.1 MB/step
    assert growth_verdict(series([10, 14, 10, 14, 10, 16])) is None               # not steady
    assert growth_verdict(series([500, 501, 502, 503, 504, 505])) is None         # < 5% overall
    assert growth_verdict(series([500, 501, 502, 503, 504, 505]), min_relative=0.0) == mb

    samples = series([1, 2, 3])
    samples[0].containers = {7: (4, 4), 9: (10, 0)}
    samples[1].containers = {7: (5, 5), 9: (10, 0)}
    samples[2].containers = {7: (6, 6), 9: (12, 0)}
    assert growing_containers(samples) == [(7, 4, 6, 6)]                          # 9 did not grow each time


def test_memory_growth_cuda_path_with_a_fake_allocator_counter(monkeypatch):
    """The CUDA branch (allocator counter decides, two object scans name the holder), run on
    CPU with the counter and the device faked; the real one is in test_gpu_training_practice."""
    import torch

    from nndoctor.checks import memory_growth
    from tests.conftest import BUGGY

    calls = {"n": 0}

    def fake_allocated(device=None):
        calls["n"] += 1
        return (100 + calls["n"]) * 2**20

    monkeypatch.setattr(memory_growth, "_parameter_device", lambda optimizer: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", fake_allocated)
    monkeypatch.setattr(memory_growth, "available_bytes", lambda device: 10 * 2**30)
    report = run_script(BUGGY / "P111_features_kept_with_graphs.py", select=["P111"])
    [finding] = report.by_code("P111")
    assert finding.evidence["device"] == "cuda" and finding.evidence["mb_per_step"] == 1.0
    assert finding.evidence["holder"] == "all_features" and finding.location.line == 22
    assert not report.internal_errors


def test_loss_stopped_improving_needs_no_decrease_over_the_collapse():
    from nndoctor.checks.labels import loss_stopped_improving

    assert loss_stopped_improving([2.1, 2.1, 1.8, 2.1, 1.6, 1.4]) is None      # still falling
    z, ratio = loss_stopped_improving([1.0, 0.97, 1.02, 0.99, 1.01, 1.0])        # a noisy plateau
    assert z > -1.645 and ratio > 0.99
    assert loss_stopped_improving([1.0, 1.0, 1.0]) is None                       # too few to tell
    nan = float("nan")
    z, _ = loss_stopped_improving([1.2] + [nan] * 6)                             # NaN: nothing to improve
    assert z != z


_HEAD_FINETUNE = """
    import torch, torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU()).requires_grad_(False).eval()
    inputs = torch.randn(32 * STEPS, 16)
    labels = (inputs[:, 0] > 0).long() + (inputs[:, 1] > 0).long()
    head = nn.Linear(64, 3)
    with torch.no_grad():
        head.bias.copy_(torch.tensor([2.5, 0.0, 0.0]))
    optimizer = torch.optim.SGD(head.parameters(), lr=0.03)
    for x, y in DataLoader(TensorDataset(inputs, labels), batch_size=32, shuffle=True):
        with torch.no_grad():
            features = backbone(x)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(head(features), y)
        loss.backward()
        optimizer.step()
"""


def test_a_collapse_that_lasts_to_the_end_of_the_run_is_reported_with_its_span(tmp_path):
    # The head of tests/fixtures/correct/head_finetune_transient_one_class.py predicts one class
    # for its first 14 steps while the loss falls: stopped there, the run ends in the collapse.
    script = tmp_path / "head_stopped_early.py"
    script.write_text(textwrap.dedent(_HEAD_FINETUNE.replace("STEPS", "14")))
    [found] = run_script(script, select=["L109"]).by_code("L109")
    assert "through the end of the observed run" in found.message
    assert found.evidence["from_step"] == 8 and found.evidence["loss_trend_z"] is None
    assert found.evidence["to_step"] == found.evidence["from_step"] + found.evidence["sampled_batches"] - 1


def test_a_collapse_that_switches_class_starts_over(tmp_path):
    # Class 0 for every prediction up to step 13 while the loss falls (not reported: it may pass),
    # then class 1 for the last two steps: no class was predicted through the end of the run.
    script = tmp_path / "switching.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        head = nn.Linear(4, 3)
        optimizer = torch.optim.SGD(head.parameters(), lr=0.0)
        for step in range(16):
            with torch.no_grad():
                head.bias.copy_(torch.eye(3)[0 if step < 14 else 1] * (60.0 - 3 * step))
            x, y = torch.randn(32, 4), torch.arange(32) % 3
            optimizer.zero_grad()
            nn.functional.cross_entropy(head(x), y).backward()
            optimizer.step()
    """))
    report = run_script(script, select=["L109"])
    assert not report.by_code("L109") and not report.internal_errors
    # The same run without the switch ends in the collapse, and is reported.
    script.write_text(script.read_text().replace("0 if step < 14 else 1", "0"))
    [found] = run_script(script, select=["L109"]).by_code("L109")
    assert found.evidence["predicted_class"] == 0 and "through the end" in found.message
