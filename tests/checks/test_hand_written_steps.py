"""O101 and M106 at the step boundary of loops without torch.optim (the ManualStep event),
and O101 past gradient slices that are always zero (nn.Embedding padding rows)."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import run_script

_LOOP = """
import torch
import torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
X, y = torch.randn(64, 4), torch.randn(64, 1)
lr = {lr}
for step in range(12):
    {before}
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
            {after}
"""


@pytest.mark.parametrize(("before", "after", "fires"), [
    ("pass", "pass", True),                      # gradients never cleared
    ("model.zero_grad()", "pass", False),        # cleared before the forward
    ("pass", "p.grad.zero_()", False),           # cleared by hand after the update
    ("pass", "p.grad = None", False),
])
def test_o101_in_a_hand_written_update_loop(tmp_path, before, after, fires):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(_LOOP.format(lr=0.01, before=before, after=after)))
    report = run_script(script, select=["O101"])
    assert bool(report.by_code("O101")) is fires
    assert not report.internal_errors
    if fires:
        assert report.by_code("O101")[0].location.line == 11  # loss.backward()
        assert "hand-written update" in report.by_code("O101")[0].message


def test_m106_needs_writes_that_change_nothing(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(_LOOP.format(lr=0.0, before="model.zero_grad()", after="pass")))
    assert run_script(script, select=["M106"]).by_code("M106")
    script.write_text(textwrap.dedent(_LOOP.format(lr=0.01, before="model.zero_grad()", after="pass")))
    assert not run_script(script, select=["M106"]).findings


def test_gradient_passes_after_training_are_not_updates(tmp_path):
    """Forward and backward without an update (a saliency map) after a hand-written training loop:
    the gradients pile up but nothing applies them, and nothing is written."""
    script = tmp_path / "saliency.py"
    script.write_text(textwrap.dedent(_LOOP.format(lr=0.01, before="model.zero_grad()", after="pass") + """
    for i in range(10):
        x = X[i:i + 1].clone().requires_grad_(True)
        model(x).sum().backward()
    """))
    report = run_script(script, select=["O101", "M106"])
    assert not report.findings and not report.internal_errors


def test_o101_skips_an_embedding_padding_row_but_not_a_cleared_gradient(tmp_path):
    script = tmp_path / "embed.py"
    source = """
        import torch
        import torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(20, 64, padding_idx=0), nn.Flatten(), nn.Linear(64 * 4, 2))
        tokens = torch.randint(1, 20, (64, 4))
        tokens[:, 3] = 0
        labels = torch.randint(0, 2, (64,))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(0, 64, 8):
            {clear}
            loss = nn.functional.cross_entropy(model(tokens[i:i + 8]), labels[i:i + 8])
            loss.backward()
            optimizer.step()
    """
    script.write_text(textwrap.dedent(source.format(clear="pass")))
    assert run_script(script, select=["O101"]).by_code("O101")
    script.write_text(textwrap.dedent(source.format(clear="optimizer.zero_grad(set_to_none=False)")))
    assert not run_script(script, select=["O101"]).findings


def test_o102_in_a_hand_written_loop_needs_the_clear_between_backward_and_update(tmp_path):
    script = tmp_path / "loop.py"
    # zero_grad(set_to_none=False) before the forward: correct, whatever the update writes
    script.write_text(textwrap.dedent(_LOOP.format(lr=0.01, before="model.zero_grad(set_to_none=False)",
                                                   after="pass")))
    report = run_script(script, select=["O102"])
    assert not report.findings and not report.internal_errors
    # the same call between backward() and the update: the update applies zeros
    buggy = _LOOP.replace("    loss.backward()\n", "    loss.backward()\n    model.zero_grad(set_to_none=False)\n")
    script.write_text(textwrap.dedent(buggy.format(lr=0.01, before="pass", after="pass")))
    assert run_script(script, select=["O102"]).by_code("O102")
