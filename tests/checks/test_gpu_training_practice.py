"""P111 and P115 on CUDA (the device GPU; skipped without one): the allocator's counter and
the TF32 settings on a tensor-core GPU."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import run_script

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_memory_growth_on_cuda_reads_the_allocator(tmp_path):
    script = tmp_path / "leak_cuda.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 4096), nn.ReLU(), nn.Linear(4096, 10)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        kept = []
        for step in range(16):
            x = torch.randn(512, 256, device="cuda")
            opt.zero_grad()
            hidden = model[1](model[0](x))
            kept.append(hidden)                  # 8 MB per step, never freed
            nn.functional.cross_entropy(model[2](hidden), torch.randint(0, 10, (512,), device="cuda")).backward()
            opt.step()
    """))
    report = run_script(script, select=["P111"])
    [finding] = report.by_code("P111")
    assert finding.evidence["device"].startswith("cuda")
    assert 7 < finding.evidence["mb_per_step"] < 10
    assert finding.evidence["projected_full_step"] > finding.evidence["last_step"]
    assert not report.internal_errors


def test_tf32_off_is_reported_by_perf_on_a_tensor_core_gpu():
    from nndoctor.commands.perf.config import PerfConfig
    from nndoctor.commands.perf.session import run_perf
    from nndoctor.commands.perf.torch.diagnosis import diagnose
    from nndoctor.run.runner import Target

    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 needs compute capability 8.0")
    before = torch.get_float32_matmul_precision()
    script = Path(__file__).parents[1] / "perf" / "scripts" / "small_convnet.py"
    try:
        torch.set_float32_matmul_precision("highest")
        _, result = run_perf(Target(str(script), []), PerfConfig(warmup=2, steps=5))
        codes = {f.code: f for f in diagnose(result)}
        assert "P115" in codes and "matmul" in codes["P115"].evidence["ops_without_tf32"]
        torch.set_float32_matmul_precision("high")
        assert "P115" not in {f.code for f in diagnose(result)}   # cudnn.allow_tf32 is on by default
    finally:
        torch.set_float32_matmul_precision(before)
