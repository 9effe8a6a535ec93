"""torch.compile under nndoctor: the compiled model trains, is observed, and is unchanged.

Our global module hooks used to run inside dynamo's trace and crash it ("already tracked for
mutation"); they now step aside while dynamo traces and observe the OptimizedModule from
outside.
"""

from __future__ import annotations

import runpy
import shutil
import sys
import warnings

import pytest
import torch

from tests.conftest import FIXTURES, run_script

SCRIPT = FIXTURES / "scripts" / "compiled_training.py"


def _plain(out, *args):
    saved = sys.argv[:]
    sys.argv = [str(SCRIPT), str(out), *args]
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = saved


@pytest.mark.parametrize("backend, shapes", [
    ("eager", "static"),
    ("eager", "dynamic"),
    ("aot_eager", "static"),
    ("aot_eager", "dynamic"),
])
def test_compiled_model_trains_identically_under_nndoctor(tmp_path, backend, shapes):
    torch._dynamo.reset()
    plain, doctored = tmp_path / "plain.pt", tmp_path / "doctored.pt"
    _plain(plain, backend, shapes)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = run_script(SCRIPT, [str(doctored), backend, shapes])
    assert report.status == "completed", report.traceback
    assert report.steps == 6
    assert not report.internal_errors, report.internal_errors
    a, b = torch.load(plain), torch.load(doctored)
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
    assert torch.equal(a["next_draw"], b["next_draw"])
    # torch's warning about global hooks describes nndoctor, not the user's program.
    assert not [w for w in caught if "global hooks on modules" in str(w.message)]


def test_compiled_model_is_observed_from_outside():
    """Checks still see the compiled model: an evaluation forward in train mode (M101)."""
    torch._dynamo.reset()
    script = FIXTURES / "scripts" / "compiled_eval_in_train_mode.py"
    report = run_script(script, select=["M101"])
    assert report.status == "completed", report.traceback
    assert report.by_code("M101"), report.findings
    assert not report.internal_errors, report.internal_errors


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="inductor on CPU needs a C++ compiler")
def test_default_inductor_backend_trains_identically_under_nndoctor(tmp_path):
    torch._dynamo.reset()
    plain, doctored = tmp_path / "plain.pt", tmp_path / "doctored.pt"
    _plain(plain, "inductor", "static")
    torch._dynamo.reset()
    report = run_script(SCRIPT, [str(doctored), "inductor", "static"])
    assert report.status == "completed", report.traceback
    assert report.steps == 6 and not report.internal_errors
    a, b = torch.load(plain), torch.load(doctored)
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
