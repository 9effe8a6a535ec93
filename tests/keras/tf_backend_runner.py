"""Runs every Keras fixture on the TensorFlow backend in ONE process and writes JSON.

Keras fixes its backend when it is first imported, and the test session imports it on
the torch backend (tests/conftest.py), so ``tests/keras/test_tf_backend.py`` gets ``results()``
from the TensorFlow child of ``tests/tf_process.py`` and checks it (written to a file, not
stdout: the fixtures may print). ``python -m tests.keras.tf_backend_runner OUT.json`` runs it alone.
It runs the scripts in-process through the engine, like ``run_script`` elsewhere.
"""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import json  # noqa: E402
import runpy  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from tests.conftest import FIXTURES, expected_lines, freeze_what_is_loaded, run_script  # noqa: E402

SHARED = FIXTURES / "keras"  # run on both backends
TF_ONLY = FIXTURES / "keras_tf"  # custom loops: TensorFlow only
OBSERVED = ("observer_training.py", "observer_custom_loop.py", "observer_nan_loop.py")


def fixtures() -> list[Path]:
    return sorted([*SHARED.glob("buggy_*.py"), *SHARED.glob("correct_*.py"),
                   *TF_ONLY.glob("buggy_*.py"), *TF_ONLY.glob("correct_*.py")])


def _report(report) -> dict:
    return {
        "status": report.status, "steps": report.steps, "traceback": report.traceback,
        "internal_errors": [f"{e.where}: {e.error}" for e in report.internal_errors],
        "findings": [{"code": f.code, "severity": int(f.severity), "message": f.message, "evidence": f.evidence,
                      "path": f.location.path if f.location else None,
                      "line": f.location.line if f.location else None} for f in report.findings],
    }


def _weights(path: Path) -> dict:
    import numpy as np

    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def observer_rule(script: Path, tmp: Path) -> dict:
    """Weights after a seeded run without and with nndoctor: equal array by array?"""
    import numpy as np

    plain, doctored = tmp / f"{script.stem}.plain.npz", tmp / f"{script.stem}.doctored.npz"
    saved = sys.argv[:]
    sys.argv = [str(script), str(plain)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved
    report = run_script(script, [str(doctored)])
    a, b = _weights(plain), _weights(doctored)
    return {"report": _report(report), "arrays": len(a),
            "different": sorted(k for k in a if k not in b or not np.array_equal(a[k], b[k]))}


def patched_attributes() -> dict:
    import keras
    import tensorflow as tf
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

    owners = (keras.Model, keras.layers.Layer, BaseOptimizer, Function, tf.GradientTape)
    return {owner.__qualname__: sorted(f"{k}={id(v)}" for k, v in vars(owner).items()) for owner in owners}


# Selections whose installed Keras/tf.data probes are recorded ([]: every check).
PROBE_SELECTIONS = ([], ["K101"], ["K105"], ["K109"], ["N101"], ["O104"], ["L106"], ["K106"])


def installed_probes() -> dict:
    """The Keras/tf.data probes an installation puts in place for each selection (Keras imported)."""
    from nndoctor.core.engine import Session
    from nndoctor.core.probes import KERAS_PROBES
    from nndoctor.instrument.extensions import install

    found = {}
    for select in PROBE_SELECTIONS:
        installation = install(Session(select=select))
        try:
            found[",".join(select)] = sorted(set(installation.probes) & set(KERAS_PROBES))
        finally:
            installation.uninstall()
    return found


def results() -> dict:
    """Every run's report, the probes, the observer-rule comparisons (Keras on TensorFlow imported)."""
    out: dict = {"fixtures": {}, "observer": {}}
    import keras

    out["backend"] = keras.config.backend()
    before = patched_attributes()
    for path in fixtures():
        name = f"{path.parent.name}/{path.name}"
        if path.name.startswith("buggy_"):
            out["fixtures"][name] = {code: {"lines": sorted(lines), **_report(run_script(path, select=[code]))}
                                     for code, lines in expected_lines(path).items()}
        else:
            out["fixtures"][name] = _report(run_script(path))
    out["probes"] = installed_probes()
    out["max_steps"] = _report(run_script(TF_ONLY / "buggy_missing_training_flag.py", max_steps=3))
    with tempfile.TemporaryDirectory() as tmp:
        for name in OBSERVED:
            script = SHARED / name if (SHARED / name).exists() else TF_ONLY / name
            out["observer"][name] = observer_rule(script, Path(tmp))
    out["patches_undone"] = patched_attributes() == before
    return out


def main() -> None:
    import keras  # noqa: F401
    import tensorflow  # noqa: F401 - loaded by the Keras backend already; frozen with the rest below

    from nndoctor.core import engine  # noqa: F401
    from nndoctor.run import runner  # noqa: F401

    freeze_what_is_loaded()  # each run's gc.collect() then walks only what the fixtures made
    Path(sys.argv[1]).write_text(json.dumps(results(), default=str))


if __name__ == "__main__":
    main()
