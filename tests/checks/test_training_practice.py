"""O110, O111, B104, M111, P116: decision functions and the cases the fixtures do not cover."""

from __future__ import annotations

import textwrap

import torch
import torch.nn as nn

from nndoctor.checks.amp import scaler_collapse_verdict
from nndoctor.checks.debug_modes import step_time_comparison
from nndoctor.checks.finetuning import batchnorm_is_frozen, running_stats_drift
from nndoctor.instrument.training_probe import trainable_parameter_count
from tests.conftest import run_script


def test_scaler_collapse_needs_a_long_run_of_skips_or_a_high_rate():
    warmup = [True] * 6 + [False] * 200            # the scale settling at the start: healthy
    assert scaler_collapse_verdict(warmup) is None
    assert scaler_collapse_verdict([False] * 10 + [True] * 15) is None
    assert "16 scaler steps" in scaler_collapse_verdict([False] * 10 + [True] * 16)
    periodic = ([False] * 3 + [True]) * 25           # one step in four skipped
    assert "25 of the last 100" in scaler_collapse_verdict(periodic)
    assert scaler_collapse_verdict(([False] * 3 + [True]) * 10) is None  # too few steps to judge a rate


def test_batchnorm_frozen_means_no_trained_affine_parameter():
    bn = nn.BatchNorm1d(4)
    assert not batchnorm_is_frozen(bn, {id(bn.weight): 1, id(bn.bias): 1})
    assert batchnorm_is_frozen(bn, {})                          # in no optimizer
    bn.requires_grad_(False)
    assert batchnorm_is_frozen(bn, {id(bn.weight): 1, id(bn.bias): 1})
    assert not batchnorm_is_frozen(nn.BatchNorm1d(4, affine=False), {})  # nothing to freeze


def test_running_stats_drift_in_std_units():
    mean0, var0 = torch.zeros(3), torch.full((3,), 4.0)
    shift, change = running_stats_drift(mean0, var0, torch.tensor([0.0, 1.0, 0.0]), torch.tensor([4.0, 4.0, 5.0]))
    assert shift == 0.5 and change == 0.25


def test_trainable_parameters_are_found_through_methods_partials_and_closures():
    import functools

    block = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    assert trainable_parameter_count(block) == 4
    assert trainable_parameter_count(block.forward) == 4
    assert trainable_parameter_count(functools.partial(block)) == 4

    def run(x):
        return block(x)

    assert trainable_parameter_count(run) == 4
    block.requires_grad_(False)
    assert trainable_parameter_count(block) == 0
    assert trainable_parameter_count(torch.relu) == 0


def test_step_time_comparison_compares_like_with_like():
    on = [(True, 0.2), (False, 0.09), (False, 0.11)]
    off = [(True, 0.05), (False, 0.03)]
    assert step_time_comparison(on, off) == (0.1, 0.03)
    assert step_time_comparison(on, []) is None


def test_clip_after_unscale_and_clip_without_scaler_are_silent(tmp_path):
    script = tmp_path / "clip_ok.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        disabled = torch.amp.GradScaler("cpu", enabled=False)
        for step in range(3):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            disabled.scale(loss).backward()
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
            disabled.step(opt)
            disabled.update()
        for step in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_((p for p in model.parameters()), 1.0)
            opt.step()
    """))
    report = run_script(script, select=["O110", "O111"])
    assert not report.findings and not report.internal_errors


def test_clip_value_before_unscale_is_reported_with_the_effective_limit(tmp_path):
    script = tmp_path / "clip_value.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        for step in range(2):
            opt.zero_grad()
            scaler.scale(model(torch.randn(8, 4)).pow(2).mean()).backward()
            torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.5)
            scaler.step(opt)
            scaler.update()
    """))
    report = run_script(script, select=["O110"])
    [finding] = report.by_code("O110")
    assert finding.evidence["scale"] == 1024.0
    assert finding.evidence["effective_limit"] == 0.5 / 1024
    assert finding.location.line == 10


def test_clipping_a_generator_under_nndoctor_gives_the_same_gradients():
    # The wrapper turns a generator of parameters into a list: the result must not change.
    from nndoctor import watch

    torch.manual_seed(0)
    a, b = nn.Linear(4, 2), nn.Linear(4, 2)
    b.load_state_dict(a.state_dict())
    x = torch.randn(8, 4)
    a(x).pow(2).sum().backward()
    b(x).pow(2).sum().backward()
    expected = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.1)
    with watch():
        got = torch.nn.utils.clip_grad_norm_((p for p in b.parameters()), 0.1)
    assert torch.equal(expected, got)
    assert torch.equal(a.weight.grad, b.weight.grad) and torch.equal(a.bias.grad, b.bias.grad)


def test_dead_filters_are_relative_to_the_layers_largest():
    from nndoctor.checks.architecture import dead_filter_indices

    weight = torch.ones(4, 2, 3, 3)
    weight[1] = 1e-5
    weight[3] = 0
    dead, largest = dead_filter_indices(weight)
    assert dead == [1, 3] and abs(largest - 3 * 2 ** 0.5) < 1e-5
    assert dead_filter_indices(torch.zeros(3, 1, 1, 1)) == ([], 0.0)
    assert dead_filter_indices(weight * 1e-6)[0] == [1, 3]            # scale-free


def test_bias_false_conv_and_conv_relu_bn_are_not_reported(tmp_path):
    script = tmp_path / "no_bias.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                              nn.Conv2d(4, 4, 3), nn.ReLU(), nn.BatchNorm2d(4),
                              nn.Flatten(), nn.Linear(64, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(2):
            opt.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)), torch.randint(0, 2, (4,))).backward()
            opt.step()
    """))
    report = run_script(script, select=["M108"])
    assert not report.findings and not report.internal_errors


def test_step_time_outliers_use_a_robust_sigma_and_twice_the_median():
    from nndoctor.checks.step_time import StepRecord, explain_step, outlier_steps

    records = [StepRecord(step=i, seconds=0.010 + 0.0005 * (i % 3)) for i in range(40)]
    records[10].seconds, records[10].checkpoint_s = 0.500, 0.480
    records[20].seconds = 0.016                                  # jitter: above 3σ but < 2× median
    slow, median, sigma = outlier_steps(records)
    assert [r.step for r in slow] == [10] and median == 0.0105
    what, where = explain_step(records[10], median)
    assert what.startswith("torch.save 480 ms")
    assert outlier_steps(records[:10])[0] == []                  # too few steps
    quiet = StepRecord(step=3, seconds=0.5)
    assert explain_step(quiet, 0.01)[0].startswith("nothing")


def test_compile_counters_and_verdicts():
    from nndoctor.checks.compilation import (
        CompileCounters,
        compile_verdict,
        first_line,
        parse_limit_warning,
    )

    before = CompileCounters.from_mapping({"stats": {"unique_graphs": 2}, "graph_break": {"print\nhint": 1}})
    now = CompileCounters.from_mapping({
        "stats": {"unique_graphs": 12},
        "graph_break": {"print\nhint": 21, "Tensor.item\nhint": 3},
        "unimplemented": {"Dynamo recompile limit exceeded\n  Explanation: …": 1},
    })
    delta = now.since(before)
    assert delta.unique_graphs == 10 and delta.graph_breaks == {"print\nhint": 20, "Tensor.item\nhint": 3}
    assert delta.limit_hits == 1 and compile_verdict(delta, steps=20) == "limit"
    assert compile_verdict(CompileCounters(unique_graphs=10), steps=12) == "recompiling"
    assert compile_verdict(CompileCounters(unique_graphs=10), steps=100) is None   # warm-up graphs only
    assert compile_verdict(CompileCounters(), steps=15, recompiles=4) == "recompiling"
    assert compile_verdict(CompileCounters(), steps=100, recompiles=4) is None      # rare recompilations
    assert compile_verdict(CompileCounters(), steps=15, recompiles=3) is None
    # Dynamo counts graph breaks when it compiles: one break at a user line is on every call.
    assert compile_verdict(CompileCounters(graph_breaks={"print": 1}), steps=20, user_breaks=1) == "graph_breaks"
    assert compile_verdict(CompileCounters(graph_breaks={"print": 2}), steps=20) is None   # not in user code
    assert compile_verdict(CompileCounters(), steps=3, user_breaks=1) is None
    assert first_line("print\nhint") == "print"

    message = ("torch._dynamo hit config.recompile_limit (8)\n   function: 'step_fn' (/tmp/train.py:6)\n"
               "   last reason: 0/7: tensor 'x' size mismatch at index 0. expected 11, actual 12\n")
    function, location, reason = parse_limit_warning(message)
    assert function == "step_fn" and location.line == 6 and reason.startswith("tensor 'x' size mismatch")
    assert parse_limit_warning("") == (None, None, None)


def test_guard_failure_records_are_grouped_by_recompilation():
    from nndoctor.checks.compilation import graph_break_suggestion, recompile_suggestion
    from nndoctor.checks.compile_records import break_reason, guard_text, split_recompilations

    stack = '\nUser stack trace:\n  File "/tmp/train.py", line 16, in scaled\n    return model(x)*lr'
    entries = [f"2/0: lr == 0.1      # return model(x)*lr  # train.py:16 in scaled{stack}",
               f"2/1: lr == 0.05     # return model(x)*lr{stack}", "2/0: lr == 0.1",
               "2/2: lr == 0.033", "2/1: lr == 0.05", "2/0: lr == 0.1"]
    groups = split_recompilations(entries)
    assert [len(g) for g in groups] == [1, 2, 3]
    assert guard_text(groups[-1][0]) == "lr == 0.033"
    assert "as a tensor" in recompile_suggestion("lr == 0.033")
    assert "mark_dynamic" in recompile_suggestion("tensor 'x' size mismatch at index 1. expected 8, actual 9")
    reason = break_reason("Unsupported Tensor.item() call\n  Explanation: Dynamo does not support it.\n  Hint: h")
    assert reason == "Unsupported Tensor.item() call: Dynamo does not support it."
    assert ".item()" in graph_break_suggestion(reason)
    assert "print" in graph_break_suggestion("Failed to trace builtin operator: … `print` …")


def test_tf32_decision_with_fake_device_capabilities():
    from nndoctor.checks.tf32 import tf32_off_ops

    a100 = ("cuda", (8, 0))
    assert tf32_off_ops(*a100, "float32", False, True, False, True) == ["matmul"]
    assert tf32_off_ops(*a100, "float32", False, True, False, False) == ["matmul", "convolution"]
    assert tf32_off_ops(*a100, "float32", False, False, False, False) == ["matmul"]   # no conv in the model
    assert tf32_off_ops(*a100, "float32", False, True, True, True) == []
    assert tf32_off_ops(*a100, "float32", True, True, False, False) == []             # autocast
    assert tf32_off_ops(*a100, "bfloat16", False, True, False, False) == []
    assert tf32_off_ops("cuda", (7, 0), "float32", False, True, False, False) == []   # V100: no TF32
    assert tf32_off_ops("cpu", None, "float32", False, True, False, False) == []


def test_tf32_flags_follow_the_matmul_precision():
    from nndoctor.checks.tf32 import tf32_flags

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert tf32_flags()[0] is False
        torch.set_float32_matmul_precision("high")
        assert tf32_flags()[0] is True
    finally:
        torch.set_float32_matmul_precision(before)


def test_a_profiler_recording_every_step_is_reported_at_its_line(tmp_path, monkeypatch):
    from nndoctor.checks.debug_modes import DebugModeLeftOn

    monkeypatch.setattr(DebugModeLeftOn, "PROFILER_MIN_STEPS", 6)   # the real threshold is 50 steps
    script = tmp_path / "profiled.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for step in range(8):
                opt.zero_grad()
                model(torch.randn(8, 4)).pow(2).mean().backward()
                opt.step()
        schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule) as prof:
            for step in range(12):
                opt.zero_grad()
                model(torch.randn(8, 4)).pow(2).mean().backward()
                opt.step()
                prof.step()
    """))
    report = run_script(script, select=["P116"])
    [finding] = report.by_code("P116")
    assert finding.location.line == 6 and finding.evidence["profiled_consecutive_steps"] == 8
    assert not report.internal_errors


def test_step_time_outliers_are_explained_only_by_what_the_median_step_lacks():
    from nndoctor.checks.step_time import StepRecord, TypicalStep, explain_step, outlier_steps

    # A mean teacher: one no-grad forward in every step; one step slow for another reason.
    records = [StepRecord(step=i, seconds=0.010, eval_forwards=1) for i in range(40)]
    records[7].seconds = 0.200
    slow, median, _ = outlier_steps(records)
    assert [r.step for r in slow] == [7]
    typical = TypicalStep.of(records)
    assert typical.eval_forwards == 1
    assert explain_step(records[7], median, typical)[0].startswith("nothing")
    records[7].eval_forwards = 11                                 # an evaluation pass in that step
    assert explain_step(records[7], median, typical)[0] == "11 evaluation forward(s)"


def test_step_time_outliers_must_cost_a_share_of_the_run():
    from nndoctor.checks.step_time import StepRecord, StepTimeOutliers, outlier_cost, outlier_steps

    # 0.6 ms CPU steps with 10 outliers of 3 ms: real outliers, but 24 ms of a 0.62 s run.
    records = [StepRecord(step=i, seconds=0.0006) for i in range(1000)]
    for i in range(5, 1000, 100):
        records[i].seconds, records[i].eval_forwards = 0.003, 1
    slow, median, _ = outlier_steps(records)
    assert len(slow) == 10
    cost, timed, share = outlier_cost(slow, median, records)
    assert round(cost, 4) == 0.024 and round(timed, 3) == 0.624
    assert share < StepTimeOutliers.MIN_SHARE
    for record in slow:                                           # 60 ms each: 0.59 s, half the run
        record.seconds = 0.060
    assert outlier_cost(slow, median, records)[2] > 0.4



def test_batchnorm_whose_parameters_an_ema_overwrites_is_not_frozen():
    from nndoctor.checks.finetuning import affine_changed, affine_copy

    teacher = nn.BatchNorm1d(4).requires_grad_(False)
    copy = affine_copy(teacher)
    assert not affine_changed(teacher, copy)
    with torch.no_grad():                                     # one EMA update from a student
        teacher.weight.mul_(0.999).add_(torch.full((4,), 1.5), alpha=0.001)
    assert affine_changed(teacher, copy)
    assert not affine_changed(nn.BatchNorm1d(4, affine=False), [])


def test_p116_goes_quiet_between_sampled_steps_and_wakes_when_a_debug_mode_starts():
    """After MAX_OFF_TIMES steps with nothing on, P116's step handler runs on sampled steps
    only (one call fewer on every other step); anomaly detection switched on later wakes it,
    and its steps are all counted."""
    from nndoctor.checks.debug_modes import DebugModeLeftOn
    from nndoctor.core.engine import Session
    from nndoctor.instrument.extensions import install
    from nndoctor.run.end import finish

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    session = Session(select=["P116"], sample_every=100, sample_budget=0)
    check = next(c for c in session.checks if c.code == "P116")
    installation = install(session)
    quiet_at = None
    try:
        for step in range(DebugModeLeftOn.MAX_OFF_TIMES + 150):
            if step == DebugModeLeftOn.MAX_OFF_TIMES + 100:
                torch.autograd.set_detect_anomaly(True)
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
            every_step = [s for s, _ in session._every_step.get("step_end", ())]
            if quiet_at is None and check not in every_step:
                quiet_at = step
                assert check in [s for s, _ in session._handlers["step_end"]]  # still on sampled steps
    finally:
        torch.autograd.set_detect_anomaly(False)
        finish(session, installation, "completed", None)
    assert quiet_at == DebugModeLeftOn.MAX_OFF_TIMES  # the first step ends no time (nothing before it)
    assert check in [s for s, _ in session._every_step["step_end"]]  # woken by set_detect_anomaly
    [finding] = session.report.by_code("P116")
    assert "was on for 50 optimizer" in finding.message, finding.message
    assert not session.report.internal_errors
