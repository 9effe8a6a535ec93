"""The Keras doctor in an environment without torch (issue 15): one subprocess in which an import
blocker makes ``import torch`` fail as if torch were not installed, running ``nndoctor run`` on a
Keras script on the TensorFlow backend. A real venv without torch was not used: building one
copies or links TensorFlow (~1.5 GB) and costs minutes; the blocker costs one TF import (~10 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES

pytest.importorskip("tensorflow")
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = FIXTURES / "tfdata" / "keras_tf_backend_fit.py"


@pytest.mark.e2e
@pytest.mark.slow
def test_keras_doctor_runs_without_torch():
    env = {**os.environ, "KERAS_BACKEND": "tensorflow",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("no_torch_child.py")), str(SCRIPT)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["torch_imported"] is False
    assert result["run_status"] == "completed" and result["status"] == 0
    assert result["internal_errors"] == []
    # The TF backend's train function fetches batches eagerly under nndoctor: same weights.
    assert result["identical_weights"] is True
    lines = {code: line for code, line, _ in result["findings"]}
    assert lines.get("K107") == 31 and lines.get("K106") == 36, result["findings"]
