"""A Keras fit stopped by ``--max-steps`` mid-epoch, on a pipeline that shuffles and maps a
``tf.numpy_function``: the process must end once the report is out. It hung at interpreter
exit (TensorFlow's map threads waiting for the GIL of a finalizing interpreter) while the
stopped iterator was still held by the ``StopRun`` traceback when nndoctor collected it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests import childproc
from tests.conftest import FIXTURES, needs

pytestmark = needs("tensorflow")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_run_stopped_inside_a_numpy_function_pipeline_exits(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    script = FIXTURES / "tfdata" / "keras_tf_backend_fit.py"
    try:
        done = childproc.run([sys.executable, "-m", "nndoctor", "run", "--max-steps", "5", "--json",
                              str(tmp_path / "report.json"), str(script), str(tmp_path / "weights.npz")],
                             env=env, cwd=tmp_path, timeout=150)
    except childproc.ChildTimedOut as hung:
        pytest.fail(f"nndoctor run --max-steps did not exit after a stopped tf.data pipeline: {hung}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopped after 5 optimizer steps" in done.stderr + done.stdout
