"""Runs the TensorFlow crash fixtures under the engine in ONE process (TensorFlow's import costs
seconds; Keras's backend is chosen once per process) and prints their reports as JSON.

Used by test_tf_crashes.py: ``python -m tests.explain.tf_crash_runner FIXTURE...``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(paths: list[str]) -> None:
    from tests.conftest import freeze_what_is_loaded, run_script

    # Every fixture imports Keras and TensorFlow: loaded now, to be frozen with the rest (after
    # tests.conftest, which imports torch._dynamo and so triton first: the other order segfaults).
    for name in ("keras", "tensorflow", "nndoctor.core.engine", "nndoctor.run.runner"):
        importlib.import_module(name)
    freeze_what_is_loaded()  # each run's gc.collect() then walks only what the fixtures made
    results = {}
    for path in paths:
        report = run_script(path, select=["E", "V"])
        results[path] = {
            "status": report.status,
            "traceback": bool(report.traceback),
            "crash": report.extra.get("crash"),
            "internal_errors": [str(e) for e in report.internal_errors],
            "findings": [{"code": f.code, "path": f.location.path if f.location else None,
                          "line": f.location.line if f.location else None, "message": f.message,
                          "fix": f.fix, "evidence": f.evidence} for f in report.findings],
        }
    json.dump(results, sys.stdout, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
