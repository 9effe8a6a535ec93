"""--try step changes re-run the user's own loop with the change injected: every step shape
gets a measured result (CPU: bf16 autocast), and a failed trial says exactly why."""

from __future__ import annotations

from pathlib import Path

import pytest

from nndoctor.cli import main
from nndoctor.commands.perf.classify import classify_step, order_advice
from nndoctor.commands.perf.config import PerfConfig
from nndoctor.commands.perf.rerun import try_changes, window_steps
from nndoctor.commands.perf.session import run_perf
from nndoctor.run.runner import Target
from tests.conftest import CORRECT

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.parametrize("script", [
    SCRIPTS / "causal_lm.py",              # logits reshaped and cast before the loss
    SCRIPTS / "dict_batch_own_loss.py",    # dict batch, loss computed inside the model
    SCRIPTS / "two_input_contrastive.py",  # two inputs, tuple output, hand-written loss
    CORRECT / "gan_two_optimizers.py",     # two models, two optimizers
], ids=lambda p: p.stem)
def test_try_amp_measures_every_step_shape(script):
    config = PerfConfig(warmup=2, steps=4, tries=("amp",), try_repeats=2)
    report, result = run_perf(Target(str(script), []), config)
    assert report.status == "stopped", report.traceback
    amp = result.trials["amp"]
    assert "error" not in amp and "skipped" not in amp, amp
    assert amp["measure"] == "re-run" and 1 <= len(amp["times_s"]) <= 2 and amp["speedup"] > 0  # adaptive repeats
    assert any(a.startswith("autocast(torch.bfloat16)") for a in amp["applied"]), amp["applied"]
    assert amp["loss_change"] is not None and amp["loss_baseline"] is not None
    # bf16 autocast changes the numbers a little, not the training.
    assert amp["loss_ok"], amp


def test_a_change_that_breaks_the_script_is_reported_with_its_error(tmp_path):
    script = tmp_path / "fused_breaks.py"
    script.write_text(
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\nmodel = nn.Linear(4, 2)\n"
        "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "for step in range(1000):\n"
        "    loss = model(torch.randn(8, 4)).square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    if opt.param_groups[0].get('fused'):\n"
        "        raise RuntimeError('this script refuses fused kernels')\n")
    results = try_changes(Target(str(script), []), ("fused-optimizer", "tf32"), warmup=1, steps=2,
                          repeats=2, cwd=str(tmp_path), device="cpu")
    assert "this script refuses fused kernels" in results["fused-optimizer"]["error"]
    assert "--try fused-optimizer" in results["fused-optimizer"]["error"]
    assert "CUDA devices only" in results["tf32"]["skipped"]


def test_a_baseline_that_ends_too_early_explains_itself(tmp_path):
    script = tmp_path / "short.py"
    script.write_text("import torch\nfrom torch import nn\nmodel = nn.Linear(4, 2)\n"
                      "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "for step in range(3):\n    model(torch.randn(2, 4)).sum().backward(); opt.step()\n")
    results = try_changes(Target(str(script), []), ("amp",), warmup=2, steps=5, repeats=2,
                          cwd=str(tmp_path), device="cpu")
    assert "ended after 3 optimizer steps" in results["amp"]["error"]


def test_short_steps_get_a_longer_window():
    assert window_steps(20, 0.5) == 20  # 10 s: long enough
    assert window_steps(200, 0.0022) == 455  # 0.44 s of 2.2 ms steps → 1 s
    assert window_steps(20, 1e-6) == 400  # at most 20 × --steps
    assert window_steps(20, None) == 20


def test_a_script_ending_inside_a_lengthened_window_is_timed_over_the_steps_it_ran(tmp_path):
    script = tmp_path / "finite.py"
    script.write_text("import torch\nfrom torch import nn\ntorch.manual_seed(0)\nmodel = nn.Linear(4, 2)\n"
                      "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "for step in range(30):\n    loss = model(torch.randn(8, 4)).square().mean()\n"
                      "    opt.zero_grad(); loss.backward(); opt.step()\n")
    # 2 warm-up + 28 steps run of a 100-step window: enough (≥ 10), so timed over 28.
    results = try_changes(Target(str(script), []), ("amp",), warmup=2, steps=100, repeats=2,
                          cwd=str(tmp_path), device="cpu", min_steps=10)
    assert "error" not in results["amp"], results["amp"]
    assert results["amp"]["speedup"] > 0 and results["amp"]["loss_variant"] is not None
    # Fewer than min_steps: still the clear error.
    short = try_changes(Target(str(script), []), ("amp",), warmup=2, steps=100, repeats=2,
                        cwd=str(tmp_path), device="cpu", min_steps=40)
    assert "ended after 30 optimizer steps" in short["amp"]["error"]


def test_finding_says_why_a_requested_trial_could_not_measure(monkeypatch):
    from nndoctor.commands.perf import measured_checks
    from nndoctor.commands.perf.torch import diagnosis

    trials = {"amp": {"error": "RuntimeError: boom (the script with --try amp injected)"}}
    finding = diagnosis._measured_advice(measured_checks.NoMixedPrecision, trials, "amp", "float32 training", None, {})
    assert "could not measure it: RuntimeError: boom" in finding.message
    assert "run nndoctor perf --try" not in finding.message


@pytest.mark.parametrize("data, busy, cuda, expected", [
    (0.5, 0.3, True, "input-bound"),
    (0.02, 0.95, True, "gpu-bound"),
    (0.02, 0.2, True, "launch-bound"),
    (0.02, 0.65, True, "mixed"),
    (0.05, None, False, "cpu"),
])
def test_classify_step(data, busy, cuda, expected):
    assert classify_step(data, busy, cuda)["class"] == expected


def test_advice_leads_with_what_fits_the_class():
    items = [{"change": "loader"}, {"change": "amp"}, {"change": "compile"}]
    assert [i["change"] for i in order_advice(items, "gpu-bound")] == ["amp", "compile", "loader"]
    assert [i["change"] for i in order_advice(items, "input-bound")][0] == "loader"


def test_cli_prints_the_rerun_trials_and_the_step_class(capsys):
    status = main(["perf", "--steps", "3", "--warmup", "1", "--try", "amp", "--try-repeats", "2",
                   str(SCRIPTS / "two_input_contrastive.py")])
    err = capsys.readouterr().err
    assert status == 0
    assert "step class: cpu" in err
    assert "your script re-run 2× per change" in err and "--try amp" in err


def test_try_amp_measures_a_hugging_face_trainer_run():
    pytest.importorskip("transformers")
    config = PerfConfig(warmup=1, steps=2, tries=("amp",), try_repeats=2)
    report, result = run_perf(Target(str(SCRIPTS / "hf_trainer_tiny.py"), []), config)
    amp = result.trials["amp"]
    assert "error" not in amp and amp["measure"] == "re-run", amp
    assert amp["applied"] == ["autocast(torch.bfloat16) on BertForSequenceClassification"]
    assert amp["loss_ok"], amp
