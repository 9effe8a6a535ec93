"""X106 with a real nn.DataParallel over two or more GPUs (skipped with fewer): the per-GPU
losses gathered into a vector and summed fire at the backward; averaged, they stay silent."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import expected_lines, run_script

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")

GPU_FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpu"


@pytest.mark.parametrize("name", ["X106_dataparallel_loss_sum.py", "X106_dataparallel_amp_sum.py"])
def test_summed_per_gpu_losses_fire_at_the_backward(name):
    path = GPU_FIXTURES / name
    report = run_script(path, select=["X106"])
    [finding] = report.by_code("X106")
    devices = torch.cuda.device_count()
    assert finding.location.line in expected_lines(path)["X106"]
    assert finding.evidence["devices"] == devices and finding.evidence["gathered_shape"] == [devices]
    assert finding.evidence["factor_vs_mean"] == devices
    assert finding.evidence["multiplier_after_sum"] == 1.0  # the GradScaler's scale is set aside
    assert not report.internal_errors


def test_averaged_per_gpu_losses_stay_silent():
    report = run_script(GPU_FIXTURES / "dataparallel_loss_mean.py")
    assert not report.by_code("X106")
    assert report.status == "completed" and not report.internal_errors
