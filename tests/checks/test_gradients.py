"""O104, O105, O106, O109 and the shared gradient statistics."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
import torch.nn as nn

from nndoctor.checks.gradients import (
    coupled_weight_decay,
    depth_ratio,
    explosion_verdict,
    update_ratios,
    update_scale_verdict,
)
from nndoctor.instrument.numerics_probe import GradientStats, gradient_stats
from tests.conftest import run_script


def test_gradient_stats_match_per_tensor_norms_with_one_computation():
    torch.manual_seed(0)
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    c = torch.randn(2, requires_grad=True)  # no gradient: left out
    (a.sum() * 2 + (b ** 2).sum()).backward()
    stats = gradient_stats([a, b, c], {id(a): "w", id(b): "v"})
    assert stats.names == ("w", "v")
    assert stats.norms == pytest.approx([a.grad.norm().item(), b.grad.norm().item()])
    assert stats.total_norm == pytest.approx(torch.cat([a.grad.flatten(), b.grad.flatten()]).norm().item())
    assert stats.rms(0) == pytest.approx(a.grad.norm().item() / math.sqrt(12))
    assert stats.nonfinite == []


def test_gradient_stats_flag_nonfinite_gradients():
    p = torch.zeros(3, requires_grad=True)
    p.grad = torch.tensor([1.0, float("nan"), 0.0])
    q = torch.zeros(2, requires_grad=True)
    q.grad = torch.ones(2)
    assert gradient_stats([q, p], {}).nonfinite == [1]
    assert gradient_stats([torch.zeros(2, requires_grad=True)], {}) is None


# -- O104 -------------------------------------------------------------------------------------------
def test_explosion_needs_three_orders_of_magnitude_over_the_baseline():
    assert explosion_verdict([1.0, 2.0, 1.5, 30.0, 200.0], 1e3, 1e5) is None  # normal drift
    kind, current, baseline = explosion_verdict([1.0, 2.0, 1.5, 30.0, 1600.0], 1e3, 1e5)
    assert kind == "growth" and current == 1600.0 and baseline == 1.5
    assert explosion_verdict([2.0, 2000.0], 1e3, 1e5) is None  # no baseline yet


def test_explosion_reports_a_huge_norm_outright():
    assert explosion_verdict([3e5], 1e3, 1e5)[0] == "huge"
    assert explosion_verdict([], 1e3, 1e5) is None


def test_clipped_gradients_do_not_count_as_exploding(tmp_path):
    source = (tmp_path / "clipped.py")
    fixture = open("tests/fixtures/buggy/O104_learning_rate_too_high.py").read()
    source.write_text(fixture.replace(
        "    loss.backward()\n",
        "    loss.backward()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"))
    assert not run_script(source, select=["O104"]).findings


# -- O105 -------------------------------------------------------------------------------------------
def stats(rms_by_layer, dims=None):
    n = len(rms_by_layer)
    return GradientStats(names=tuple(f"l{i}" for i in range(n)), norms=tuple(r * 10 for r in rms_by_layer),
                         numels=(100,) * n, dims=tuple(dims or (2,) * n))


def test_depth_ratio_compares_first_and_last_quarter_of_weight_matrices():
    ratio, early, late = depth_ratio(stats([1e-6, 1e-5, 1e-2, 1e-2, 1e-2, 1e-2, 1e-1, 1.0]))
    assert ratio == pytest.approx(1e-6 / 1e-1) and early == "l0" and late == "l7"


def test_depth_ratio_ignores_biases_and_shallow_models():
    assert depth_ratio(stats([1e-9, 1.0, 1.0, 1.0], dims=(1, 2, 2, 2))) is None  # 3 matrices
    assert depth_ratio(stats([1.0, 1.0, 1.0, 1.0]))[0] == pytest.approx(1.0)


def test_kaiming_initialised_relu_network_of_the_same_depth_does_not_vanish(tmp_path):
    # With PyTorch's default Linear init the same 12-layer ReLU stack does vanish (measured
    # ratio 2.7e-4); Kaiming init is the fix the docs recommend, and it brings it to ~0.6.
    fixture = open("tests/fixtures/buggy/O105_deep_sigmoid_stack.py").read()
    fixture = fixture.replace("nn.Sigmoid()", "nn.ReLU()").replace(
        "optimizer =",
        "for m in model:\n    if isinstance(m, nn.Linear):\n"
        "        nn.init.kaiming_normal_(m.weight, nonlinearity='relu')\noptimizer =")
    (tmp_path / "relu.py").write_text(fixture)
    assert not run_script(tmp_path / "relu.py", select=["O105"]).findings


# -- O106 -------------------------------------------------------------------------------------------
def test_update_ratio_is_relative_change():
    w = torch.ones(100)
    assert update_ratios([(w, w * 1.001)])[0] == pytest.approx(1e-3, rel=1e-3)
    assert update_ratios([(torch.zeros(4), torch.ones(4))]) == [None]


def test_update_scale_verdict_uses_the_median_and_ignores_zero_steps():
    assert update_scale_verdict([1e-3, 2e-3, 5e-4], 1e-5, 1e-1, 3) is None
    assert update_scale_verdict([1e-8, 1e-8, 1e-1], 1e-5, 1e-1, 3) == ("low", 1e-8)
    assert update_scale_verdict([0.5, 0.4, 0.3], 1e-5, 1e-1, 3) == ("high", 0.4)
    assert update_scale_verdict([0.0, 0.0, 0.0, 1e-3], 1e-5, 1e-1, 3) is None  # M106's case


# -- O109 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, expected", [
    (lambda p: torch.optim.Adam(p, weight_decay=1e-2), 1e-2),
    (lambda p: torch.optim.NAdam(p, weight_decay=1e-3), 1e-3),
    (lambda p: torch.optim.Adam(p), None),
    (lambda p: torch.optim.AdamW(p, weight_decay=1e-2), None),
    (lambda p: torch.optim.Adam(p, weight_decay=1e-2, decoupled_weight_decay=True), None),
    (lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=1e-4), None),
])
def test_coupled_weight_decay(make, expected):
    assert coupled_weight_decay(make([nn.Parameter(torch.zeros(2))])) == expected


def test_adam_finding_points_at_the_optimizer_construction(tmp_path):
    script = tmp_path / "adam.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.Adam(
            model.parameters(), weight_decay=1e-4)
        for _ in range(2):
            opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()
    """))
    (finding,) = run_script(script, select=["O109"]).by_code("O109")
    assert finding.location.line in (5, 6) and finding.count == 1



def test_m105_names_unused_layers_not_steps_that_had_no_gradient_at_all(tmp_path):
    """M105 reports parameters that never got a gradient while others did (an unused layer).
    When no parameter ever had one at step time (zero_grad() between backward and step), every
    parameter would be "unused": the cause is O102's (or O103's), and M105 stays silent — also
    when the script's model is still alive at the end of the run, so the verdict does not
    depend on when the garbage collector freed it."""
    import runpy

    from nndoctor.core.engine import Session
    from nndoctor.instrument.extensions import install
    from nndoctor.run.end import finish

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nimport torch.nn as nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.body, self.extra = nn.Linear(8, 2), nn.Linear(4, 4)  # extra: never called\n"
        "    def forward(self, x):\n"
        "        return self.body(x)\n"
        "torch.manual_seed(0)\n"
        "model = Net()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))\n"
        "for step in range(5):\n"
        "    loss = nn.functional.cross_entropy(model(x), y)\n"
        "    loss.backward()\n"
        "    if CLEAR_BEFORE_STEP:\n"
        "        optimizer.zero_grad()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n")
    found = {}
    for clear in (False, True):
        session = Session(select=["M105"])
        installation = install(session)
        try:
            kept = runpy.run_path(str(script), init_globals={"CLEAR_BEFORE_STEP": clear}, run_name="__main__")
            finish(session, installation, "completed", None)  # the model still alive here
        finally:
            installation.uninstall()
        del kept
        found[clear] = [f.evidence["parameters"] for f in session.report.findings if f.code == "M105"]
    assert found[False] == [["Net.extra.weight", "Net.extra.bias"]]  # the layer forward never calls
    assert found[True] == []  # no gradient anywhere at step time: not "unused parameters"
