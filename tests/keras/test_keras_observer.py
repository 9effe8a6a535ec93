"""The observer rule and lazy import for Keras: nndoctor never changes a Keras run, and never
imports Keras unless the user's script does."""

from __future__ import annotations

import json
import os
import runpy
import sys

import numpy as np
import pytest

from tests import childproc
from tests.conftest import FIXTURES, run_script

pytest.importorskip("keras")

SCRIPT = FIXTURES / "keras" / "observer_training.py"


def _plain(out):
    saved = sys.argv[:]
    sys.argv = [str(SCRIPT), str(out)]
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = saved


def test_seeded_keras_fit_is_identical_under_nndoctor(tmp_path):
    plain, doctored = tmp_path / "plain.npz", tmp_path / "doctored.npz"
    _plain(plain)
    report = run_script(SCRIPT, [str(doctored)])
    assert report.status == "completed" and report.steps == 8
    assert not report.internal_errors, report.internal_errors
    a, b = np.load(plain), np.load(doctored)
    assert sorted(a.files) == sorted(b.files) and len(a.files) > 5
    for key in a.files:
        assert np.array_equal(a[key], b[key]), key


def _env():
    env = dict(os.environ, KERAS_BACKEND="torch")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(FIXTURES.parents[1])) if p)
    return env


def test_nndoctor_does_not_import_keras_for_a_script_that_does_not(tmp_path):
    script = tmp_path / "no_keras.py"
    script.write_text("x = 1\n")
    # The engine as `nndoctor run` drives it, without tests.conftest (whose torch._dynamo import
    # doubles this child's start-up and has nothing to do with Keras).
    code = ("import sys; from nndoctor.core.engine import Session; "
            "from nndoctor.run.runner import Target, run_target; "
            f"r = run_target(Target({str(script)!r}, []), Session()); "
            "print('keras' in sys.modules, r.status)")
    result = childproc.run([sys.executable, "-c", code], env=_env(),
                            cwd=FIXTURES.parents[1], timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "completed"]


@pytest.mark.e2e
def test_cli_patches_keras_imported_by_the_script(tmp_path):
    """`nndoctor run` on a script that imports Keras itself (the post-import hook path)."""
    out = tmp_path / "report.json"
    script = FIXTURES / "keras" / "buggy_softmax_from_logits.py"
    result = childproc.run([sys.executable, "-m", "nndoctor", "run", "--json", str(out), str(script)],
                            env=_env(), timeout=300)
    data = json.loads(out.read_text())
    assert result.returncode == 1, result.stderr
    assert [f["code"] for f in data["findings"]] == ["K101"]
    assert "buggy_softmax_from_logits.py:14" in result.stderr
    assert not data["internal_errors"]
