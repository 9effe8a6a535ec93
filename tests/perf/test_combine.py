"""Paying changes re-run together, CUDA graphs on top (perf/combine.py): which sets are run
and how the verdict and the advice follow from the re-runs' timings."""

from __future__ import annotations

from nndoctor.perf.checks import combined_advice
from nndoctor.perf.combine import paying_set, try_combined


def solo_results():
    return {"fused-optimizer": {"pays_off": True}, "cuda-graphs": {"pays_off": False, "speedup": 0.99},
            "amp": {"pays_off": False},
            "batch-size": {"pays_off": True, "best": {"factor": 8, "batch_size": 256}}}


def recorded_runner(samples_per_s: dict[str, float], calls: list[list[str]]):
    """A stand-in for one script re-run that returns recorded throughputs per change set."""
    def run(changes):
        calls.append(list(changes))
        rate = samples_per_s["+".join(changes)] * (1 + 0.01 * (len(calls) % 2))  # 1% run-to-run noise
        return {"seconds_per_step": 256 / rate, "samples_per_step": 256}
    return run


def test_paying_set_uses_the_best_batch_and_one_compile():
    assert paying_set(solo_results()) == ["fused-optimizer", "batch-size=8"]
    both = {"compile": {"pays_off": True}, "cuda-graphs": {"pays_off": True}}
    assert paying_set(both) == ["cuda-graphs"]


def test_cuda_graphs_measured_on_top_of_the_paying_set_and_advised_when_they_pay():
    calls: list[list[str]] = []
    run = recorded_runner({"fused-optimizer+batch-size=8": 160_000.0,
                           "fused-optimizer+batch-size=8+cuda-graphs": 195_000.0}, calls)
    combined = try_combined(solo_results(), ("cuda-graphs", "fused-optimizer", "batch-size"), run,
                            repeats=2, device="cuda")
    assert calls == [["fused-optimizer", "batch-size=8"], ["fused-optimizer", "batch-size=8", "cuda-graphs"]] * 2
    graphs = combined["cuda-graphs"]
    assert graphs["pays_off"] and 1.19 < graphs["speedup"] < 1.25
    [item] = combined_advice({"combined": combined}, advised={"batch-size", "fused-optimizer"})
    assert item["change"] == "cuda-graphs" and item["measured_with"] == ["fused-optimizer", "batch-size=8"]


def test_no_gain_on_top_gives_no_advice_and_cpu_runs_nothing_extra():
    calls: list[list[str]] = []
    run = recorded_runner({"fused-optimizer+batch-size=8": 160_000.0,
                           "fused-optimizer+batch-size=8+cuda-graphs": 160_500.0}, calls)
    combined = try_combined(solo_results(), ("cuda-graphs", "batch-size"), run, repeats=2, device="cuda")
    assert not combined["cuda-graphs"]["pays_off"]
    assert combined_advice({"combined": combined}, advised=set()) == []
    assert try_combined({"amp": {"pays_off": True}}, ("amp", "cuda-graphs"), run, repeats=2, device="cpu") is None
