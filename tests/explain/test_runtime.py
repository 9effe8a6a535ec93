"""The crash path of ``nndoctor run``/``watch()``: robustness, no cost on success, observer rule."""

from __future__ import annotations

import argparse
import sys

import pytest
import torch

from nndoctor.report import render_text
from tests.conftest import FIXTURES, run_script

CRASH = FIXTURES / "crash"


def test_a_crash_inside_the_explanation_machinery_still_shows_the_users_traceback(monkeypatch):
    def broken(error, session):
        raise RuntimeError("explainer bug")

    monkeypatch.setattr("nndoctor.commands.explain.runtime.explain_crash", broken)
    report = run_script(CRASH / "E117_one_based_labels.py", select=["E"])
    assert report.status == "crashed"
    assert "IndexError: Target 3 is out of bounds." in report.traceback
    assert "E117_one_based_labels.py" in report.traceback
    assert not report.findings
    assert any(e.where == "crash explanation" and "explainer bug" in e.error for e in report.internal_errors)
    assert "Target 3 is out of bounds" in render_text(report)


def test_failing_evidence_falls_back_to_the_message_alone(monkeypatch):
    def broken(tensor):
        raise RuntimeError("cannot read the target")

    monkeypatch.setattr("nndoctor.commands.explain.shapes.integer_range", broken)
    report = run_script(CRASH / "E117_one_based_labels.py", select=["E"])
    (finding,) = report.by_code("E117")
    assert finding.evidence == {"target": 3} and finding.location.line == 10
    assert any(e.where == "E117 evidence" for e in report.internal_errors)


def test_unknown_error_gets_no_guessed_explanation(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nconfig = {}\nlr = config['lr']\n")
    report = run_script(script, select=["E"])
    assert report.status == "crashed" and "KeyError: 'lr'" in report.traceback
    assert not report.findings
    assert report.extra["crash"] == {"type": "KeyError", "message": "'lr'", "location": f"{script}:3",
                                     "source": "lr = config['lr']", "explained_by": None}


class _Noisy(torch.utils.data.Dataset):
    """Items drawn with the global RNG, like random augmentations."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.rand(3) + i


def test_successful_runs_are_unchanged_and_the_fetch_patch_is_undone():
    from torch.utils.data._utils.fetch import _MapDatasetFetcher

    import nndoctor

    original = _MapDatasetFetcher.fetch

    def epoch():
        torch.manual_seed(0)
        return [b.clone() for b in torch.utils.data.DataLoader(_Noisy(), batch_size=2, shuffle=True)]

    plain = epoch()
    with nndoctor.watch(select=["E"]) as report:  # the crash instrumentation alone
        assert _MapDatasetFetcher.fetch is not original
        watched = epoch()
    assert _MapDatasetFetcher.fetch is original
    assert all(torch.equal(a, b) for a, b in zip(plain, watched))
    assert not report.findings and not report.internal_errors


def test_refetching_samples_leaves_the_random_streams_untouched():
    import random

    from nndoctor.commands.explain.samples import probe_items

    torch.manual_seed(1)
    random.seed(1)
    before = (torch.get_rng_state(), random.getstate())
    probes = probe_items(_Noisy(), [0, 1, 2])
    assert [p.shapes for p in probes] == [["[3]"]] * 3
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]


def test_argparse_in_a_notebook_is_explained_under_watch(monkeypatch):
    import nndoctor

    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher.py", "-f",
                                      "/root/.local/share/jupyter/runtime/kernel-1a2b.json"])
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    with pytest.raises(SystemExit):
        with nndoctor.watch() as report:
            parser.parse_args()
    (finding,) = report.by_code("E127")
    assert "kernel-1a2b.json" in finding.message and "parse_args(args=[])" in finding.fix
    assert finding.location.path.endswith("test_runtime.py")
