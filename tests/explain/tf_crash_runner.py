"""Runs the TensorFlow crash fixtures under the engine in ONE process (TensorFlow's import costs
seconds; Keras's backend is chosen once per process) and prints their reports as JSON.

test_tf_crashes.py gets ``results(fixtures())`` from the TensorFlow child of ``tests/tf_process.py``;
``python -m tests.explain.tf_crash_runner [FIXTURE...]`` prints it alone.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def fixtures() -> list[str]:
    """The crash fixtures (those with an ``# expect:`` line) and the correct programs, as
    test_tf_crashes.py parametrizes them."""
    from tests.conftest import FIXTURES, expected_lines

    folder = FIXTURES / "crash" / "tensorflow"
    return [str(p) for p in sorted(p for p in folder.glob("*.py") if expected_lines(p))
            + sorted(folder.glob("correct_*.py"))]


def results(paths: list[str]) -> dict:
    """Each fixture's report under the engine (E and V codes), by path."""
    from tests.conftest import run_script

    out = {}
    for path in paths:
        report = run_script(path, select=["E", "V"])
        out[path] = {
            "status": report.status,
            "traceback": bool(report.traceback),
            "crash": report.extra.get("crash"),
            "internal_errors": [str(e) for e in report.internal_errors],
            "findings": [{"code": f.code, "path": f.location.path if f.location else None,
                          "line": f.location.line if f.location else None, "message": f.message,
                          "fix": f.fix, "evidence": f.evidence} for f in report.findings],
        }
    return out


def main(paths: list[str]) -> None:
    from tests.conftest import freeze_what_is_loaded

    # Every fixture imports Keras and TensorFlow: loaded now, to be frozen with the rest (after
    # tests.conftest, which imports torch._dynamo and so triton first: the other order segfaults).
    for name in ("keras", "tensorflow", "nndoctor.core.engine", "nndoctor.run.runner"):
        importlib.import_module(name)
    freeze_what_is_loaded()  # each run's gc.collect() then walks only what the fixtures made
    json.dump(results(paths or fixtures()), sys.stdout, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
