"""Paying changes re-run together, the others measured on top (perf/combine.py): which sets
are run and how the verdicts and the advice follow from the re-runs' timings."""

from __future__ import annotations

from nndoctor.commands.perf.combine import paying_set, try_combined
from nndoctor.commands.perf.torch.diagnosis import combined_advice

TRIED = ("cuda-graphs", "fused-optimizer", "batch-size")


def solo_results():
    # As measured alone on an H100 (MLP patient): only the larger batch paid.
    return {"fused-optimizer": {"pays_off": False, "speedup": 0.98, "loss_ok": True},
            "cuda-graphs": {"pays_off": False, "speedup": 0.87, "loss_ok": True},
            "batch-size": {"pays_off": True, "speedup": 6.78, "best": {"factor": 8, "batch_size": 256}}}


def recorded_runner(samples_per_s: dict[str, float], calls: list[list[str]]):
    """A stand-in for one script re-run that returns recorded throughputs per change set."""
    def run(changes):
        calls.append(list(changes))
        rate = samples_per_s["+".join(changes)] * (1 + 0.01 * (len(calls) % 2))  # 1% run-to-run noise
        return {"seconds_per_step": 256 / rate, "samples_per_step": 256}
    return run


def test_paying_set_uses_the_best_batch_and_one_compile():
    assert paying_set(solo_results()) == ["batch-size=8"]
    both = {"compile": {"pays_off": True}, "cuda-graphs": {"pays_off": True}}
    assert paying_set(both) == ["cuda-graphs"]


def test_changes_that_pay_only_together_on_top_of_the_batch_are_advised():
    calls: list[list[str]] = []
    run = recorded_runner({"batch-size=8": 130_000.0, "batch-size=8+fused-optimizer": 130_000.0,
                           "batch-size=8+cuda-graphs": 140_000.0,
                           "batch-size=8+fused-optimizer+cuda-graphs": 186_000.0}, calls)
    combined = try_combined(solo_results(), TRIED, run, repeats=2, device="cuda")
    assert calls[:4] == [["batch-size=8"], ["batch-size=8", "fused-optimizer"], ["batch-size=8", "cuda-graphs"],
                         ["batch-size=8", "fused-optimizer", "cuda-graphs"]]
    best = combined["best_added"]
    assert best["added"] == ["fused-optimizer", "cuda-graphs"] and 1.4 < best["speedup"] < 1.45
    items = combined_advice({"combined": combined}, advised={"batch-size"})
    assert [i["change"] for i in items] == ["fused-optimizer", "cuda-graphs"]
    assert items[0]["measured_with"] == ["batch-size=8"]


def test_no_gain_on_top_gives_no_advice_and_cpu_skips_cuda_graphs():
    calls: list[list[str]] = []
    run = recorded_runner({"batch-size=8": 130_000.0, "batch-size=8+fused-optimizer": 130_500.0}, calls)
    combined = try_combined(solo_results(), TRIED, run, repeats=2, device="cpu")
    assert {tuple(c) for c in calls} == {("batch-size=8",), ("batch-size=8", "fused-optimizer")}
    assert combined["best_added"] is None and combined_advice({"combined": combined}, advised=set()) == []
    assert try_combined({"amp": {"pays_off": True}}, ("amp",), run, repeats=2, device="cuda") is None


def test_an_undecided_addition_gets_more_rounds_and_is_judged_on_them():
    """A real 1.2× gain on top, timed on a machine where one run was disturbed (40% slower):
    three or four rounds cannot tell it from noise, five interleaved rounds (each side's
    extremes left out) can."""
    calls: list[list[str]] = []
    disturbed = iter([1.0, 1.0, 0.6] + [1.0] * 20)

    def run(changes):
        calls.append(list(changes))
        rate = (120_000.0 if "cuda-graphs" in changes else 100_000.0) * next(disturbed)
        return {"seconds_per_step": 256 / rate, "samples_per_step": 256}

    results = {"batch-size": {"pays_off": True, "speedup": 6.0, "best": {"factor": 8}},
               "cuda-graphs": {"pays_off": False, "speedup": 0.9, "loss_ok": True}}
    combined = try_combined(results, ("cuda-graphs", "batch-size"), run, repeats=3, device="cuda")
    assert len(calls) == 10  # 3 rounds of 2, then 2 more rounds of 2
    added = combined["added"][0]
    assert added["pays_off"] and 1.15 < added["speedup"] < 1.25, added


def test_a_noise_level_difference_stays_undecided_after_the_extra_rounds():
    calls: list[list[str]] = []
    factors = iter([1.0, 1.3, 0.8, 1.0, 1.25, 0.75, 1.0, 1.3, 0.7, 1.2, 0.9, 1.1] * 3)

    def run(changes):
        calls.append(list(changes))
        return {"seconds_per_step": 256 / (100_000.0 * next(factors)), "samples_per_step": 256}

    results = {"batch-size": {"pays_off": True, "speedup": 6.0, "best": {"factor": 8}},
               "fused-optimizer": {"pays_off": False, "speedup": 0.95, "loss_ok": True}}
    combined = try_combined(results, ("fused-optimizer", "batch-size"), run, repeats=3, device="cuda")
    assert len(calls) <= 10 and not combined["added"][0]["pays_off"]


def test_batches_made_in_the_loop_are_timed_per_step_and_render():
    """A language model drawing its tokens on the device: no DataLoader counts samples, and no
    larger batch is among the changes, so the combined re-runs compare seconds per step (an H100
    run crashed the report on the missing samples before)."""
    from nndoctor.commands.perf.render import combined_lines

    def run(changes):
        return {"seconds_per_step": 0.010 if "fused-optimizer" in changes else 0.0125, "samples_per_step": None}

    results = {"amp": {"pays_off": True}, "sdpa": {"pays_off": True},
               "fused-optimizer": {"pays_off": False, "speedup": 1.01, "loss_ok": True}}
    combined = try_combined(results, ("amp", "sdpa", "fused-optimizer"), run, repeats=2, device="cuda")
    assert combined["unit"] == "steps/s" and combined["steps_per_s"] == 80.0
    added = combined["added"][0]
    assert added["pays_off"] and added["speedup"] == 1.25 and added["unit"] == "steps/s"
    lines = combined_lines(combined)
    assert lines[0] == "--try together (amp, sdpa): 80.0 steps/s"
    assert lines[1].startswith("  + fused-optimizer: 1.25× on top (100.0 steps/s")
    assert combined_lines({"changes": ["amp"], "samples_per_s": None}) == ["--try together (amp): not timed"]
