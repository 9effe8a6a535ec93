"""Observer rule: the same seed gives bit-identical weights and the same next RNG draw with and
without nndoctor — with DataLoader workers (fork and spawn), dropout, BatchNorm and an LR schedule."""

from __future__ import annotations

import runpy
import sys

import pytest
import torch

from tests.conftest import FIXTURES, run_script

SCRIPT = FIXTURES / "scripts" / "observer_training.py"


def _plain(out, context):
    saved = sys.argv[:]
    sys.argv = [str(SCRIPT), str(out), context]
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = saved


@pytest.mark.parametrize("context", ["", "fork", "spawn"])
def test_training_is_bit_identical_under_nndoctor(tmp_path, context):
    plain, doctored = tmp_path / "plain.pt", tmp_path / "doctored.pt"
    _plain(plain, context)
    report = run_script(SCRIPT, [str(doctored), context])
    assert report.status == "completed" and report.steps == 12
    a, b = torch.load(plain), torch.load(doctored)
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
    assert torch.equal(a["next_draw"], b["next_draw"])
    assert not report.internal_errors


def test_training_practice_patches_leave_the_weights_bit_identical(tmp_path):
    script = FIXTURES / "scripts" / "observer_amp_checkpoint.py"
    plain, doctored = tmp_path / "plain.pt", tmp_path / "doctored.pt"
    saved = sys.argv[:]
    sys.argv = [str(script), str(plain)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved
    report = run_script(script, [str(doctored)])
    assert report.status == "completed" and report.steps == 10
    a, b = torch.load(plain), torch.load(doctored)
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
    assert torch.equal(a["next_draw"], b["next_draw"])
    assert not report.internal_errors
    assert not [f for f in report.findings if f.code in ("O110", "O111", "M111", "P116")]
