"""N101 and the shared statistics on CUDA (the device GPU; skipped in CI): the asynchronous
loss flags, the device-side finiteness sums and the armed trace."""
from __future__ import annotations

import textwrap

import pytest
import torch

from tests.conftest import run_script

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SCRIPT = """
    import torch, torch.nn as nn

    class Energy(nn.Module):
        def forward(self, x):
            return torch.exp(x)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Energy(), nn.Linear(8, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 4, device="cuda"), torch.randn(16, 1, device="cuda")
    for step in range(STEPS):
        batch = x * 1000 if step >= BAD else x
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(batch), y)
        loss.backward()
        if torch.isfinite(loss):  # a skipped update keeps the weights finite for the trace
            opt.step()
"""


@pytest.mark.parametrize("bad, steps", [(2, 6), (40, 48)])  # inside the window, and long after it
def test_overflow_is_traced_to_the_module_on_cuda(tmp_path, bad, steps):
    path = tmp_path / "overflow.py"
    path.write_text(textwrap.dedent(SCRIPT).replace("STEPS", str(steps)).replace("BAD", str(bad)))
    report = run_script(path, select=["N101"])
    (finding,) = report.by_code("N101")
    assert finding.first_step == bad
    assert finding.evidence["module_type"] == "Energy", finding.message
    assert not report.internal_errors


def test_summarize_on_cuda_matches_the_cpu_numbers():
    from nndoctor.instrument.stats import summarize

    x = torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 255
    cpu, gpu = summarize(x), summarize(x.cuda())
    for name in ("min", "max", "mean", "std", "zero_fraction"):
        assert getattr(gpu, name) == pytest.approx(getattr(cpu, name), rel=1e-5), name
    x[0, 0, 0, 0] = float("nan")
    assert summarize(x.cuda()).nonfinite == 1
