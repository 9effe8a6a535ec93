"""benchmarks/perf_patients.py: the advice becomes the patient's flags mechanically, and the
summary compares configurations by their median rate over the rounds (fast: nothing is trained)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "perf_patients.py"


@pytest.fixture(scope="module")
def patients():
    spec = importlib.util.spec_from_file_location("perf_patients", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_advice_becomes_flags(patients):
    advice = [{"change": "amp"}, {"change": "sdpa"}, {"change": "compile"}, {"change": "cuda-graphs"},
              {"change": "fused-optimizer"}, {"change": "fewer-syncs"},
              {"change": "batch-size", "batch_size": 128, "factor": 4}]
    assert patients.advice_to_flags(advice) == [
        "--amp", "--sdpa", "--compile-mode", "reduce-overhead", "--fused", "--sync-every", "100",
        "--batch-size", "128", "--lr-scale", "2"]  # cuda-graphs replaces plain compile; √4 for Adam


def test_summary_uses_each_configuration_median(patients):
    rows = [{"label": "naive", "flags": [], "samples_per_s": 100.0},
            {"label": "advised", "flags": ["--amp"], "samples_per_s": 290.0},
            {"label": "grid", "flags": ["--amp", "--fused"], "samples_per_s": 300.0},
            {"label": "grid", "flags": ["--fused"], "samples_per_s": None, "error": "OOM"},
            {"label": "advised", "flags": ["--amp"], "samples_per_s": 270.0},
            {"label": "naive", "flags": [], "samples_per_s": 120.0}]
    summary = patients.summarize(rows)
    assert summary["naive_samples_per_s"] == 110.0 and summary["advised_samples_per_s"] == 280.0
    assert summary["best_flags"] == ["--amp", "--fused"]
    assert summary["advised_over_best"] == pytest.approx(280 / 300)
    assert summary["advised_within_90pct_of_best"] and summary["advised_at_least_2x_where_best_is"]


def test_summary_takes_medians_and_treats_reordered_flags_as_one_configuration(patients):
    advised = ["--sync-every", "100", "--batch-size", "256", "--fused"]
    same_in_grid = ["--batch-size", "256", "--sync-every", "100", "--fused"]
    rows = [{"label": "naive", "flags": [], "samples_per_s": v} for v in (10.0, 11.0, 30.0)]
    rows += [{"label": "advised", "flags": advised, "samples_per_s": v} for v in (100.0, 105.0)]
    rows += [{"label": "grid", "flags": same_in_grid, "samples_per_s": 95.0}]
    rows += [{"label": "grid", "flags": ["--batch-size", "256", "--sync-every", "1"], "samples_per_s": v}
             for v in (150.0, 90.0, 92.0)]  # one lucky round does not make it the best
    summary = patients.summarize(rows)
    assert summary["naive_samples_per_s"] == 11.0  # median, not mean (17)
    assert summary["advised_samples_per_s"] == 100.0  # median of 100, 105 and the grid's 95
    assert summary["advised_is_best"] and summary["advised_over_best"] == 1.0
    assert summary["min_median_max"]["--batch-size 256 --sync-every 1"] == [90, 92, 150]


def test_the_grids_hold_the_options_the_issue_names(patients):
    lm = patients.lm_grid(tiny=False)
    assert ["--sync-every", "100", "--amp", "--sdpa", "--fused", "--compile"] in lm and len(lm) == 9
    mlp = patients.mlp_grid(tiny=False, batch=32)
    assert any("reduce-overhead" in flags and "256" in flags and "--fused" in flags for flags in mlp)


def test_confirm_remeasures_advised_and_the_grids_best_points(patients, tmp_path, monkeypatch):
    """--stage confirm: fresh runs of the advised flags and the grid's top points decide
    advised/best, not the grid's (upward-biased) best median."""
    rows = [{"label": "grid", "flags": flags, "round": r, "samples_per_s": rate}
            for flags, rates in ((["--fused"], (200, 210, 190)), (["--amp"], (150, 150, 150)),
                                 (["--sdpa"], (100, 100, 100)), ([], (50, 50, 50)))
            for r, rate in enumerate(rates)]
    grid = {"patient": "mlp", "card": "test", "base_flags": ["--steps", "1"], "advised_flags": ["--amp"],
            "rows": rows, "summary": {"advised_over_best": 0.75}}
    (tmp_path / "grid.json").write_text(patients.json.dumps(grid))
    fresh = {("--fused",): 160.0, ("--amp",): 150.0, ("--sdpa",): 100.0}
    measured: list[tuple[str, ...]] = []

    def fake_measure(script, patient, base, flags):
        measured.append(tuple(flags))
        return fresh[tuple(flags)]

    monkeypatch.setattr(patients, "measure_in_process", fake_measure)
    args = patients.argparse.Namespace(grid_result=str(tmp_path / "grid.json"), confirm_top=2, confirm_repeats=3)
    result = patients.confirm(args, tmp_path, tmp_path)
    summary = result["summary"]
    # advised (--amp) is among the grid's top 2, so it is measured once per round, not twice
    assert sorted(set(measured)) == [("--amp",), ("--fused",)] and len(measured) == 6
    assert summary["best_flags"] == "--fused"
    assert summary["advised_over_best"] == pytest.approx(150 / 160)
    assert summary["advised_within_90pct_of_best"] is True
    assert summary["grid_selection"] == {"advised_over_best": 0.75}


def test_the_decoder_patient_is_the_tutorial_model_and_runs_tiny(patients, tmp_path):
    """The issue-29 decoder: hand-written attention, AdamW without foreach/fused, tied embeddings;
    every grid option runs at the CPU smoke-test size (one in-process point each)."""
    source = patients.DECODER_SCRIPT
    assert "foreach=False, fused=args.fused" in source and "self.lm_head.weight = self.wte.weight" in source
    assert "att = F.softmax(att, dim=-1)" in source and "clip_grad_norm_" in source
    grid = patients.decoder_grid(tiny=False)
    assert ["--sync-every", "100", "--amp", "--sdpa", "--fused", "--compile"] in grid
    assert ["--sync-every", "100", "--tf32", "--sdpa", "--fused"] in grid and len(grid) == 11
    script = tmp_path / "decoder.py"
    script.write_text(source)
    base = [*patients.TINY["decoder"][:-4], "--warmup-steps", "1", "--steps", "1"]
    for flags in (["--amp", "--sdpa", "--fused"], []):
        assert patients.measure_in_process(script, "decoder", base, flags) > 0


def test_the_combination_item_adds_no_flag_of_its_own(patients):
    advice = [{"change": "amp"}, {"change": "fused-optimizer"},
              {"change": "combination", "changes": ["amp", "fused-optimizer"], "measured_speedup": 3.1}]
    assert patients.advice_to_flags(advice) == ["--amp", "--fused"]
