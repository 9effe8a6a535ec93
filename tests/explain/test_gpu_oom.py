"""E108 on a real CUDA out-of-memory error (the device GPU; skipped in CI)."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import run_script

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_out_of_memory_splits_the_allocated_memory_into_model_state_and_the_rest(tmp_path):
    script = tmp_path / "keeps_graphs.py"
    script.write_text(
        "import torch, torch.nn as nn\n"
        "model = nn.Linear(4096, 4096).cuda()\n"
        "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "outs = []\n"
        "for step in range(10_000):\n"
        "    x = torch.randn(32768, 4096, device='cuda')\n"
        "    out = model(x)\n"  # line 7: the forward's output and its graph are kept
        "    outs.append(out)\n"
        "    if step == 0:\n"
        "        out.square().mean().backward(retain_graph=True)\n"
        "        opt.step()\n"
    )
    report = run_script(script, select=["E"])
    (finding,) = report.by_code("E108")
    accounting = finding.evidence["memory_accounting"]
    params = (4096 * 4096 + 4096) * 4
    assert accounting["parameters"] == params and accounting["gradients"] == params
    assert accounting["optimizer_state"] >= 2 * params and accounting["optimizers"] == ["Adam"]
    assert accounting["allocated"] > 10 * params
    assert "Adam state" in finding.message and "activations, batches and other tensors" in finding.message
    assert "the batch and what the forward keeps for backward are the lever" in finding.message
    assert finding.location.line in (6, 7), finding.location  # the batch or the forward
