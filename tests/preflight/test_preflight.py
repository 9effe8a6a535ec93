"""Preflight: each active test fires on its buggy fixture at the marked line, stays silent on
every correct training program, and leaves the user's run bit-identical."""

from __future__ import annotations

import os
import runpy
import sys
import time

import pytest
import torch

from nndoctor.cli import main
from nndoctor.commands.preflight.probe import attach
from nndoctor.core.engine import Session
from nndoctor.core.findings import Severity
from nndoctor.run.runner import Target, run_target
from tests.conftest import CORRECT, FIXTURES, correct_programs, expected_lines
from tests.snapshot import assert_findings_snapshot

PREFLIGHT = FIXTURES / "preflight"
# Correct programs preflight cannot test, and says why: the training runs in child processes
# (mp.spawn), or no torch optimizer steps (a hand-written update). A model called as
# model(**batch) is replayed with its keyword arguments (the forward hook sees them).
# Programs preflight does not test: training in other processes, or hand-written parameter updates
# (preflight starts at the first optimizer step, and these loops have no optimizer).
TRAINED_ELSEWHERE = {"ddp_spawn_gloo", "fsdp2_fully_shard", "hand_rolled_data_parallel",
                     "hand_written_sgd_then_saliency", "word_language_model_zipf_tokens"}
CODES = ("M107", "H101", "H102")


def run_preflight(path, args=(), *, stop=True, budget_s=3.0, **session_kwargs):
    session = Session(**session_kwargs)
    # A short overfit budget keeps the suite fast: a slow model ends "inconclusive", never "failed".
    attach(session, stop=stop, budget_s=budget_s)
    cwd = os.getcwd()
    try:
        return run_target(Target(str(path), list(args)), session)
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("path", sorted(PREFLIGHT.glob("*.py")), ids=lambda p: p.stem)
def test_buggy_fixture_fires_at_marked_line(path):
    expected = expected_lines(path)
    report = run_preflight(path, budget_s=30.0)
    assert report.status == "stopped", report.traceback
    assert report.extra["preflight"]["ran"], report.extra["preflight"]
    for code, lines in expected.items():
        found = report.by_code(code)
        assert found, f"{code} did not fire: {report.extra['preflight']['tests']} {report.internal_errors}"
        assert {f.location.line for f in found} & lines, [str(f.location) for f in found]
        assert all(f.location.path.endswith(path.name) for f in found)
    assert not report.internal_errors, report.internal_errors
    # What the user reads, word for word (tests/snapshot.py; update with --snapshot-update).
    assert_findings_snapshot(f"preflight/{path.stem}", report.findings, base=PREFLIGHT,
                             source=f"nndoctor preflight {path.name}")


def test_batch_mixing_names_the_first_mixing_module():
    report = run_preflight(PREFLIGHT / "M107_view_instead_of_transpose.py")
    finding = report.by_code("M107")[0]
    assert finding.evidence["first_mixing_module"] == "rnn"
    assert finding.evidence["grad_other_samples"] > 0


def test_overfit_failure_gives_both_loss_curves():
    report = run_preflight(PREFLIGHT / "H101_dead_hidden_layer.py", budget_s=30.0)
    losses = report.by_code("H101")[0].evidence["losses"]
    assert set(losses) == {"user's learning rate", "10× learning rate"}
    assert min(losses["10× learning rate"]) > 0.3 * losses["10× learning rate"][0]


def test_gradcheck_measures_the_error_of_the_wrong_backward():
    report = run_preflight(PREFLIGHT / "H102_wrong_backward.py")
    evidence = report.by_code("H102")[0].evidence
    assert evidence["function"].endswith("Cube") and evidence["relative_error"] > 0.05


@pytest.mark.parametrize("program", correct_programs(), ids=lambda p: p.stem)
def test_correct_program_passes_every_active_test(program):
    started = time.perf_counter()
    report = run_preflight(program)
    seconds = time.perf_counter() - started
    preflight = report.extra["preflight"]
    if program.stem in TRAINED_ELSEWHERE:
        assert not preflight["ran"] and preflight["reason"], preflight
    else:
        assert preflight["ran"], preflight
    bad = [f for f in report.findings if f.code in CODES and f.severity >= Severity.WARNING]
    assert not bad, "\n".join(f"{f.code} {f.location}: {f.message}" for f in bad)
    failed = [t for t in preflight["tests"] if t["status"] == "failed"]
    assert not failed, failed
    assert not report.internal_errors, report.internal_errors
    print(f"{program.stem}: preflight {preflight.get('seconds', 0):.2f} s, whole run {seconds:.2f} s, "
          + ", ".join(f"{t['name'].split(' (')[0]}={t['status']}" for t in preflight["tests"]))


def test_correct_rnn_with_custom_function_is_checked_not_skipped():
    report = run_preflight(CORRECT / "rnn_time_first_transpose.py", budget_s=30.0)
    statuses = {t["name"]: t["status"] for t in report.extra["preflight"]["tests"]}
    assert statuses["batch independence (M107)"] == "passed"
    assert statuses["gradcheck of custom autograd Functions (H102)"] == "passed"
    assert statuses["overfit one batch (H101)"] == "passed"


SCRIPT = FIXTURES / "scripts" / "observer_training.py"


def test_run_with_preflight_is_bit_identical(tmp_path):
    plain, doctored = tmp_path / "plain.pt", tmp_path / "doctored.pt"
    saved = sys.argv[:]
    sys.argv = [str(SCRIPT), str(plain), ""]
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = saved
    report = run_preflight(SCRIPT, [str(doctored), ""], stop=False)
    assert report.status == "completed" and report.extra["preflight"]["ran"]
    a, b = torch.load(plain), torch.load(doctored)
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
    assert torch.equal(a["next_draw"], b["next_draw"])


def test_preflight_command_prints_the_table_and_stops(capsys):
    status = main(["preflight", str(PREFLIGHT / "H102_wrong_backward.py")])
    err = capsys.readouterr().err
    assert status == 1
    assert "preflight on a copy of Net" in err and "gradcheck of custom autograd Functions" in err
    assert "H102 gradcheck-failed" in err and "stopped" in err


def test_preflight_without_an_optimizer_says_it_did_not_run():
    report = run_preflight(FIXTURES / "scripts" / "never_trains.py")
    assert report.extra["preflight"]["ran"] is False
    assert "no optimizer step" in report.extra["preflight"]["reason"]
