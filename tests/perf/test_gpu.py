"""On a CUDA machine (the device H100; skipped in CI): real syncs, CUDA events, the step trials."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nndoctor.commands.perf.config import PerfConfig
from nndoctor.commands.perf.session import run_perf
from nndoctor.commands.perf.torch.diagnosis import diagnose
from nndoctor.core.findings import Severity
from nndoctor.run.runner import Target

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SCRIPTS = Path(__file__).parent / "scripts"


def test_item_every_step_is_a_real_sync_on_cuda():
    _, result = run_perf(Target(str(SCRIPTS / "item_every_step.py"), []), PerfConfig(warmup=3, steps=10))
    assert result.breakdown.syncs_per_step == pytest.approx(1.0)
    found = [f for f in diagnose(result) if f.code == "P103"]
    assert found and found[0].evidence["kinds"] == {".item()": 10}
    assert result.breakdown.gpu_busy_fraction is not None and 0 < result.breakdown.gpu_busy_fraction <= 1


def test_conv_net_facts_and_measured_trials():
    config = PerfConfig(warmup=3, steps=10, tries=("amp", "channels_last", "cudnn-benchmark"))
    report, result = run_perf(Target(str(SCRIPTS / "small_convnet.py"), []), config)
    facts = result.facts
    assert facts.device == "cuda" and facts.has_conv and facts.input_channels_last is False
    assert facts.peak_memory_bytes and facts.peak_memory_bytes > 0
    assert result.device.capability >= (7, 0)
    for name in ("amp", "channels_last", "cudnn-benchmark"):
        trial = result.trials[name]
        if "skipped" in trial:  # pruned before re-running (e.g. cudnn.benchmark on already): says why
            assert trial["predicted"]["skip"] == trial["skipped"], trial
            continue
        assert trial["speedup"] > 0 and trial["loss_ok"], trial
    codes = {f.code: f for f in diagnose(result)}
    # Each of P105/P106/P110 is either confirmed by its measurement (warning) or withdrawn.
    for code, name in (("P105", "amp"), ("P106", "channels_last"), ("P110", "cudnn-benchmark")):
        if "speedup" not in result.trials[name]:
            continue
        assert (code in codes) == bool(result.trials[name]["pays_off"])
        if code in codes:
            assert codes[code].severity == Severity.WARNING and codes[code].evidence["measured"]


def test_try_compile_times_the_compiled_step_and_checks_its_loss():
    config = PerfConfig(warmup=3, steps=10, tries=("compile",))
    _, result = run_perf(Target(str(SCRIPTS / "small_convnet.py"), []), config)
    trial = result.trials["compile"]
    assert "error" not in trial, trial
    # Adaptive repeats: one re-run when the verdict is clear, up to --try-repeats when not.
    assert trial["speedup"] > 0 and 1 <= len(trial["times_s"]) <= config.try_repeats
    assert trial["loss_ok"], trial  # the compiled step computes the same loss (within 1%)


def test_try_loader_on_cuda_confirms_pinned_and_unpinned_workers_end_to_end():
    config = PerfConfig(warmup=2, steps=6, tries=("loader",), try_seconds=0.5)
    _, result = run_perf(Target(str(SCRIPTS / "cuda_loader.py"), []), config)
    loader = result.trials["loader"]
    assert loader["measure"] == "end-to-end", loader.get("confirm_error")
    assert {c["pin_memory"] for c in loader["confirmed"]} == {False, True}
    assert all(c["batches_from_loader"] == c["steps"] > 0 for c in loader["confirmed"])
    # 24 ms of loading per batch in the main process: any worker count beats it.
    assert loader["best"]["num_workers"] > 0 and loader["speedup"] > 1.5


def test_try_sdpa_cuda_graphs_and_batch_size_on_cuda():
    config = PerfConfig(warmup=5, steps=10, tries=("sdpa", "cuda-graphs", "batch-size"))
    _, result = run_perf(Target(str(SCRIPTS / "handwritten_attention.py"), ["cuda"]), config)
    sdpa, graphs, batch = (result.trials[name] for name in ("sdpa", "cuda-graphs", "batch-size"))
    assert sdpa["applied"][0].startswith("sdpa in attn (CausalSelfAttention)") and sdpa["loss_ok"], sdpa
    assert graphs["applied"] == ["compile(mode='reduce-overhead') on TinyGPT"] and graphs["loss_ok"], graphs
    sizes = {row["factor"]: row for row in batch["sizes"]}
    assert sizes[1]["batch_size"] == 8 and sizes[8]["batch_size"] == 64, sizes
    assert all(row["peak_memory_bytes"] > 0 and row["samples_per_s"] > 0 for row in sizes.values())
    # A launch-bound toy: 8× the batch costs little more per step, so samples/s grows.
    assert batch["best"]["factor"] > 1 and batch["pays_off"], batch


def test_an_input_bound_loop_times_the_step_changes_on_the_captured_batch_on_cuda():
    """Issue 29: the GPU waits for a sleepy loader; amp, channels_last, cudnn-benchmark and tf32
    are timed in process on the captured batch (not re-run), the global flags are restored, and
    the advice follows the captured verdicts and their end-to-end confirmation."""
    from nndoctor.commands.perf.torch.diagnosis import advice

    flags = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32)
    config = PerfConfig(warmup=2, steps=6, tries=("loader", "amp", "channels_last", "cudnn-benchmark", "tf32"),
                        try_seconds=0.5)
    _, result = run_perf(Target(str(SCRIPTS / "cuda_loader.py"), []), config)
    trials = result.trials
    captured = trials["captured_step"]
    assert "error" not in captured, captured
    for name in ("amp", "channels_last", "cudnn-benchmark", "tf32"):
        assert trials[name]["measure"] == "captured batch" and trials[name]["speedup"] > 0, trials[name]
    assert "baseline" not in trials  # nothing was re-run
    assert (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32) == flags
    advised = {item["change"] for item in advice(result)}
    assert "loader" in advised
    if captured["winners"] and captured["advice"] in ("end to end", "step only"):
        assert set(captured["winners"]) <= advised
    else:
        assert not advised & {"amp", "channels_last", "cudnn-benchmark", "tf32"}
