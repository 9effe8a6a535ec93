"""B101, B102, B103."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn as nn

from nndoctor.checks.batchnorm import momentum_verdict, stats_fingerprint, tiny_batch_verdict
from nndoctor.core.findings import Severity
from tests.conftest import run_script


@pytest.mark.parametrize("momentum, expected", [
    (0.1, None), (0.01, None), (None, None), (0.3, None),
    (0.5, Severity.WARNING), (0.9, Severity.ERROR), (0.99, Severity.ERROR), (0.999, Severity.ERROR),
])
def test_momentum_that_reads_like_a_tf_decay(momentum, expected):
    assert momentum_verdict(momentum) == expected


def test_tiny_batch_uses_the_median_so_a_short_last_batch_is_fine():
    assert tiny_batch_verdict([32, 32, 32, 4], 8, 3) is None
    assert tiny_batch_verdict([4, 4, 2], 8, 3) == 4
    assert tiny_batch_verdict([4, 4], 8, 3) is None  # not enough forwards yet


def test_fingerprint_covers_mean_and_variance():
    bn = nn.BatchNorm1d(3)
    before = stats_fingerprint(bn)
    bn(torch.randn(8, 3) + 5)
    after = stats_fingerprint(bn)
    assert before.shape == (6,) and not torch.equal(before, after)
    assert stats_fingerprint(nn.BatchNorm1d(3, track_running_stats=False)) is None


def test_cumulative_average_and_default_momentum_are_not_reported(tmp_path):
    script = tmp_path / "bn_ok.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16, momentum=None), nn.ReLU(),
                              nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Linear(16, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(6):
            x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    """))
    report = run_script(script, select=["B101", "B102", "B103"])
    assert report.steps == 6 and not report.findings


def test_running_stats_frozen_by_switching_tracking_off_after_construction(tmp_path):
    script = tmp_path / "bn_untracked.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 2))
        model[1].track_running_stats = False
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(5):
            x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    """))
    (finding,) = run_script(script, select=["B103"]).by_code("B103")
    assert "track_running_stats=False" in finding.message and finding.location.line == 4
