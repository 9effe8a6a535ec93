"""--try sdpa, batch-size and cuda-graphs: the attention rewrite on FX graphs (fast, in
process), the batch-size summary and its advice, and one re-run of a hand-written GPT."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nndoctor.commands.perf.render import trial_lines
from nndoctor.commands.perf.rerun import summarize_batch_sizes, try_changes
from nndoctor.commands.perf.torch.diagnosis import batch_size_advice
from nndoctor.commands.perf.torch.sdpa import (
    AttentionTracer,
    _microbenchmark,
    outputs_agree,
    rewrite,
)
from nndoctor.commands.perf.trials import parse_tries
from nndoctor.run.runner import Target

SCRIPTS = Path(__file__).parent / "scripts"
T, D = 8, 16


class CausalMasked(nn.Module):
    """softmax(q kᵀ · 1/√d, causal masked_fill) v — the nanoGPT form."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, q, k, v):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(self.mask == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v


class AdditiveMask(nn.Module):
    """BERT's form: torch.matmul, division, an additive mask, dropout."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, q, k, v, mask):
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D)
        scores = scores + mask
        return torch.matmul(self.drop(torch.softmax(scores, dim=-1)), v)


class WeightsReturned(nn.Module):
    def forward(self, q, k, v):
        weights = F.softmax(q @ k.transpose(-2, -1), dim=-1)
        return weights @ v, weights


def _qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, T, D, generator=g) for _ in range(3)]


@pytest.mark.parametrize("module, extra, described", [
    (CausalMasked(), [], "boolean mask, scale 0.25"),
    (AdditiveMask().eval(), [torch.zeros(2, 1, 1, T).masked_fill(torch.rand(2, 1, 1, T) > 0.7, -1e9)],
     "additive mask, scale 0.25"),
])
def test_handwritten_attention_is_replaced_by_sdpa_with_equal_outputs(module, extra, described):
    traced = torch.fx.symbolic_trace(module)
    fused, done, refused = rewrite(traced)
    assert done == [described] and refused == []
    targets = [n.target for n in fused.graph.nodes]
    assert F.scaled_dot_product_attention in targets and F.softmax not in targets and torch.softmax not in targets
    args = [*_qkv(), *extra]
    agree, worst = outputs_agree(module(*args), fused(*args))
    assert agree, worst


def test_dropout_of_the_weights_becomes_sdpa_dropout():
    fused, done, _ = rewrite(torch.fx.symbolic_trace(AdditiveMask().train()))
    node = next(n for n in fused.graph.nodes if n.target is F.scaled_dot_product_attention)
    assert node.kwargs["dropout_p"] == pytest.approx(0.1) and "dropout 0.1" in done[0]


def test_attention_whose_weights_are_used_elsewhere_is_left_alone():
    fused, done, refused = rewrite(torch.fx.symbolic_trace(WeightsReturned()))
    assert done == [] and refused == ["the attention weights are used elsewhere"]


def test_attention_left_as_written_is_timed_on_its_own_shapes():
    traced = torch.fx.symbolic_trace(WeightsReturned())
    text = _microbenchmark(traced, _qkv(), repeats=1)
    assert text.startswith("measured on its shapes instead (q (2, 3, 8, 16), torch.float32")
    assert "scaled_dot_product_attention" in text and "hand-written" in text


def test_outputs_agree_rejects_a_different_result():
    a = torch.ones(4)
    assert not outputs_agree(a, a * 1.01)[0] and outputs_agree(a, a + 1e-6)[0]


def test_tracer_finds_the_innermost_module_that_writes_attention():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.ff = CausalMasked(), nn.Linear(D, D)

        def forward(self, q, k, v):
            return self.ff(self.attn(q, k, v))

    block = Block()
    tracer = AttentionTracer()
    tracer.start(block)
    block(*_qkv())
    tracer.stop()
    assert tracer.modules == [block.attn]


def test_parse_tries_knows_the_new_trials():
    assert parse_tries(["sdpa,cudagraphs", "batch"]) == ("sdpa", "cuda-graphs", "batch-size")


def _run(samples_per_step, seconds, applied=(), error=None):
    if error:
        return {"error": error}
    return {"samples_per_step": samples_per_step, "seconds_per_step": seconds, "applied": list(applied),
            "peak_memory_bytes": int(2**30 * samples_per_step / 64), "memory_total_bytes": 80 * 2**30}


def test_batch_size_summary_reports_throughput_memory_and_what_did_not_fit():
    runs = {
        "baseline": [_run(64, 0.010), _run(64, 0.0102)],
        "batch-size=2": [_run(128, 0.012, ["batch_size 64 → 128"]), _run(128, 0.0121, ["batch_size 64 → 128"])],
        "batch-size=4": [_run(0, 0, error="torch.OutOfMemoryError: CUDA out of memory")],
        "batch-size=8": [],
    }
    result = summarize_batch_sizes(runs, (2, 4, 8))
    sizes = {row["factor"]: row for row in result["sizes"]}
    assert sizes[1]["batch_size"] == 64 and sizes[2]["batch_size"] == 128
    assert sizes[2]["samples_per_s"] == pytest.approx(128 / 0.0121, rel=0.02)
    assert "out of memory" in sizes[4]["error"] and "not tried" in sizes[8]["error"]
    assert result["best"]["factor"] == 2 and result["pays_off"]
    assert result["speedup"] == pytest.approx((128 / 0.01205) / (64 / 0.0101), rel=0.02)
    item = batch_size_advice(result)
    assert item["batch_size"] == 128 and item["from"] == 64
    assert "Goyal et al. 2017" in item["learning_rate"] and "√2" in item["learning_rate"]
    text = "\n".join(trial_lines({"batch-size": result}))
    assert "batch 128" in text and "samples/s" in text and "peak GPU memory 2.00 GiB of 80" in text
    assert "does not fit in GPU memory" in text


def test_batch_size_without_a_dataloader_is_skipped_with_the_reason():
    runs = {"baseline": [{"samples_per_step": None, "seconds_per_step": 0.01, "applied": []}] * 2,
            "batch-size=2": [{"samples_per_step": None, "seconds_per_step": 0.01, "applied": []}] * 2}
    assert "DataLoader" in summarize_batch_sizes(runs, (2,))["skipped"]


def test_rerun_replaces_handwritten_attention_and_grows_the_batch(tmp_path):
    results = try_changes(Target(str(SCRIPTS / "handwritten_attention.py"), []),
                          ("sdpa", "batch-size", "cuda-graphs"), warmup=1, steps=2, repeats=2,
                          cwd=str(tmp_path), device="cpu")
    sdpa = results["sdpa"]
    assert sdpa["applied"] == ["sdpa in attn (CausalSelfAttention) (boolean mask, scale 0.3536; "
                               f"outputs agree within {sdpa['applied'][0].rsplit(' ', 1)[1]}"], sdpa
    assert sdpa["loss_ok"], sdpa  # the same training, another kernel
    sizes = {row["factor"]: row for row in results["batch-size"]["sizes"]}
    assert sizes[1]["batch_size"] == 8 and sizes[2]["batch_size"] == 16 and sizes[4]["batch_size"] == 32
    assert all(row["samples_per_s"] > 0 for row in sizes.values())
    assert "need a CUDA device" in results["cuda-graphs"]["skipped"]
    assert results["baseline"]["warmup"] == 3  # compiled changes start the window later
