"""N101–N105: the pure decision functions, and the run-level behaviours fixtures can't show."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
import torch.nn as nn

from nndoctor.checks.nonfinite_loss import NonfiniteOrigin, explain_origin, scalar_is_finite
from nndoctor.checks.numerics import (
    active_units,
    dead_fraction,
    dead_verdict,
    float16_autocast_active,
    saturation_fraction,
    saturation_verdict,
    unit_axis,
)
from nndoctor.instrument.numerics_probe import ModuleRecord, first_nonfinite, observe_module
from tests.conftest import BUGGY, run_script


def write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


# -- N101 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [(1.5, True), (math.nan, False), (math.inf, False)])
def test_scalar_loss_finiteness_on_cpu(value, expected):
    assert scalar_is_finite(torch.tensor(value, requires_grad=True) * 2) is expected
    assert scalar_is_finite(torch.tensor([1.0, value])) is expected


def test_integer_and_non_tensor_losses_count_as_finite():
    assert scalar_is_finite(torch.tensor(3)) is True
    assert scalar_is_finite(None) is True


@pytest.mark.parametrize(("values", "expected"), [
    (torch.tensor(0.5), True), (torch.tensor([float("nan")]), False), (torch.tensor([[float("inf")]]), False),
    (torch.tensor([1.0, 2.0]), True), (torch.tensor([1.0, float("-inf")]), False),
])
def test_the_device_flag_of_a_loss(values, expected):
    """N101's flag for a device loss (computed here on CPU, read at once without a ring): one
    kernel for a one-element loss, isfinite().all() for more elements, the same answer."""
    from nndoctor.checks.nonfinite_loss import NonfiniteLoss
    from nndoctor.core.engine import Session
    from nndoctor.core.events import Backward

    check = Session(checks=[NonfiniteLoss]).checks[0]
    loss = values.requires_grad_() * 1
    assert check._device_check(Backward(step=200, sampled=False, tensor=loss)) is expected


def test_first_nonfinite_is_the_first_completed_module_with_bad_output():
    records = [
        ModuleRecord("0", "Linear", True, True),
        ModuleRecord("1", "LogFeatures", False, True),
        ModuleRecord("2", "Linear", False, False),
    ]
    assert first_nonfinite(records).qualname == "1"
    assert first_nonfinite(records[:1]) is None


def test_observe_module_reads_input_and_output_finiteness():
    x = torch.tensor([[1.0, -1.0]])
    record = observe_module("log", nn.Identity(), (x,), torch.log(x))
    assert record.output_finite is False and record.input_finite is True
    assert observe_module("argmax", nn.Identity(), (x,), x.argmax(dim=1)) is None


def test_observe_module_reuses_the_flag_of_an_unchanged_previous_output():
    x = torch.tensor([[float("inf"), 1.0]])
    first = observe_module("a", nn.Identity(), (torch.ones(1, 2),), x)
    second = observe_module("b", nn.Identity(), (x,), x * 0, [first])
    assert second.input_finite is first.output_finite is False
    assert second.output_finite is False  # inf * 0 = nan
    x.zero_()  # modified in place: the stale flag must not be reused
    third = observe_module("c", nn.Identity(), (x,), x + 1, [first])
    assert third.input_finite is True


def test_half_precision_is_summed_wide_enough_not_to_overflow():
    big = torch.full((1000,), 60000.0, dtype=torch.float16)  # finite; its float16 sum overflows
    record = observe_module("h", nn.Identity(), (big,), big)
    assert record.output_finite is True


def origin(**overrides):
    base = dict(loss_step=5, traced_step=5, module="encoder.2", module_type="LogFeatures",
                first_module=False, inputs_finite=True, weights_finite=True,
                weights_finite_at_loss_step=None)
    base.update(overrides)
    return NonfiniteOrigin(**base)


def test_message_names_the_step_and_the_module_that_creates_the_nan():
    text = explain_origin(origin())
    assert "step 5" in text and "`encoder.2` (LogFeatures)" in text and "created there" in text


def test_message_blames_the_data_when_the_first_module_received_nan():
    text = explain_origin(origin(first_module=True, inputs_finite=False))
    assert "input batch already held NaN/Inf" in text


def test_message_gives_the_exact_rerun_when_the_untraced_update_broke_the_weights():
    text = explain_origin(origin(traced_step=21, loss_step=20, weights_finite=False,
                                 weights_finite_at_loss_step=True))
    assert "step 20" in text and "step 21" in text and "NNDOCTOR_FULL_WINDOW=21" in text


def test_message_points_outside_modules_when_no_module_output_was_nonfinite():
    text = explain_origin(origin(module=None, module_type=None, inputs_finite=None, weights_finite=None))
    assert "outside the nn.Modules" in text


def test_nan_in_the_data_is_attributed_to_the_input(tmp_path):
    script = write(tmp_path, "nan_data.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        x[3, 1] = float("nan")
        for step in range(2):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """)
    report = run_script(script, select=["N101"])
    (finding,) = report.by_code("N101")
    assert "input batch already held NaN/Inf" in finding.message
    assert finding.first_step == 0 and finding.location.line == 10


def test_untraced_nan_that_corrupts_the_weights_is_reported_honestly(tmp_path):
    script = write(tmp_path, "late_nan.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        for step in range(22):
            target = y * float("inf") if step == 18 else y
            opt.zero_grad()
            nn.functional.mse_loss(model(x), target).backward()
            opt.step()
    """)
    report = run_script(script, select=["N101"])
    (finding,) = report.by_code("N101")
    assert finding.first_step == 18
    assert finding.evidence["traced_step"] == 19
    assert "NNDOCTOR_FULL_WINDOW=19" in finding.message
    assert not report.internal_errors


def test_nan_on_a_sampled_step_after_the_window_is_traced_on_the_next_forward():
    # After the window, sampled steps do not record module outputs for N101 (a cost of a
    # reduction per module): a NaN there is found like on any other step, by the armed trace.
    # The fixture overflows from step 20, here a sampled step after a 4-step window.
    report = run_script(BUGGY / "N101_overflow_on_untraced_step.py", select=["N101"],
                        full_window=4, sample_every=20)
    (finding,) = report.by_code("N101")
    # The loop skips the update, so the optimizer-step counter (nndoctor's step) stays at 20
    # for the traced forward that follows.
    assert finding.first_step == 20 and finding.evidence["traced_step"] == 20
    assert finding.evidence["nonfinite_losses_seen"] == 2
    assert finding.evidence["module"] == "1" and finding.evidence["module_type"] == "Energy"
    assert not report.internal_errors


def test_tracer_hooks_are_gone_after_the_run(tmp_path):
    from torch.nn.modules import module as module_mod

    before = (len(module_mod._global_forward_hooks), len(module_mod._global_forward_pre_hooks))
    test_untraced_nan_that_corrupts_the_weights_is_reported_honestly(tmp_path)
    after = (len(module_mod._global_forward_hooks), len(module_mod._global_forward_pre_hooks))
    assert after == before


# -- N102 ------------------------------------------------------------------------------------------
def test_grad_scaler_skip_steps_are_not_reported(tmp_path):
    # init_scale so large that the scaled gradients overflow: the scaler skips the first
    # steps (optimizer.step() is not called), lowers the scale, then trains normally.
    script = write(tmp_path, "scaler_skips.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, backoff_factor=2.0 ** -20, growth_interval=1000)
        x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
        skipped = 0
        for step in range(12):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x).float(), y)
            scaler.scale(loss).backward()
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped += scaler.get_scale() < before
        assert skipped > 0
    """)
    report = run_script(script, select=["N102", "N105", "N101"])
    assert report.status == "completed", report.traceback
    assert report.steps > 0
    assert not report.findings, [f.message for f in report.findings]


# -- N103 / N104 -----------------------------------------------------------------------------------
def test_units_are_features_for_linear_outputs_and_channels_for_conv_outputs():
    assert unit_axis((32, 10)) == 1 and unit_axis((4, 7, 10)) == 2 and unit_axis((4, 8, 5, 5)) == 1
    assert unit_axis((10,)) is None
    out = torch.zeros(4, 3, 2, 2)
    out[:, 1] = 1.0
    assert active_units(out).tolist() == [False, True, False]
    assert active_units(torch.zeros(4)) is None
    assert dead_fraction(active_units(out)) == pytest.approx(2 / 3)


def test_dead_verdict_uses_the_union_of_activity_over_the_window():
    alive_later = [torch.tensor([True] + [False] * 9), torch.tensor([False] * 9 + [True])] * 2
    assert dead_verdict(alive_later, 128, 0.9, 64, 4) is None  # 2 of 10 alive: 80% dead
    dead = [torch.tensor([True] + [False] * 19)] * 4
    assert dead_verdict(dead, 128, 0.9, 64, 4) == (19, 20)
    assert dead_verdict(dead[:3], 128, 0.9, 64, 4) is None  # too few batches
    assert dead_verdict(dead, 32, 0.9, 64, 4) is None  # too few observations


def test_saturation_fraction_separates_unit_scale_from_raw_inputs():
    torch.manual_seed(0)
    x = torch.randn(256, 32)
    assert float(saturation_fraction(torch.tanh(x), nn.Tanh())) < 0.05
    assert float(saturation_fraction(torch.tanh(x * 100), nn.Tanh())) > 0.9
    assert float(saturation_fraction(torch.sigmoid(x * 100), nn.Sigmoid())) > 0.9
    assert saturation_fraction(x, nn.ReLU()) is None


def test_saturation_verdict_needs_enough_batches_and_the_threshold():
    assert saturation_verdict([0.9, 0.8, 0.7], 0.5, 4) is None
    assert saturation_verdict([0.9, 0.8, 0.7, 0.6], 0.5, 4) == pytest.approx(0.75)
    assert saturation_verdict([0.2] * 8, 0.5, 4) is None


def test_saturated_output_layer_is_confidence_not_a_bug(tmp_path):
    script = write(tmp_path, "confident.py", """
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())
        with torch.no_grad():
            model[2].weight.mul_(100)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(64, 8)
        y = (x[:, :1] > 0).float()
        for step in range(6):
            opt.zero_grad()
            nn.functional.binary_cross_entropy(model(x), y).backward()
            opt.step()
    """)
    report = run_script(script, select=["N104"])
    assert not report.by_code("N104")


# -- N105 ------------------------------------------------------------------------------------------
def test_float16_autocast_is_recognised_and_bfloat16_is_not():
    assert float16_autocast_active() is None
    with torch.autocast("cpu", dtype=torch.float16):
        assert float16_autocast_active() == "cpu"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert float16_autocast_active() is None


SCALED_RUN = """
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for step in range(12):
        target = y * float("inf") if step in {BAD} else y
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        loss = nn.functional.mse_loss(out.float(), target)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
"""


def test_an_occasional_overflow_that_the_grad_scaler_skips_is_not_reported(tmp_path):
    once = write(tmp_path, "once.py", SCALED_RUN.replace("{BAD}", "{5}"))
    report = run_script(once, select=["N101"])
    assert report.steps > 0 and not report.findings and not report.internal_errors


def test_recurring_nonfinite_losses_are_reported_even_with_a_grad_scaler(tmp_path):
    often = write(tmp_path, "often.py", SCALED_RUN.replace("{BAD}", "{5, 6, 7, 8}"))
    (finding,) = run_script(often, select=["N101"]).by_code("N101")
    # steps count completed optimizer steps; the scaler skipped one before iteration 5
    assert finding.first_step in (4, 5) and finding.evidence["nonfinite_losses_seen"] >= 3
