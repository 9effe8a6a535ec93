"""K checks on Keras 3 ``fit``/``evaluate`` (torch backend), run in-process like the PyTorch fixtures.

- every buggy fixture in tests/fixtures/keras fires its check at the line marked ``# expect``;
- the correct Keras programs there report no error or warning from any check (PyTorch or K);
- patches are undone, ``--max-steps`` stops a ``fit``, ``evaluate`` is observed too.
"""

from __future__ import annotations

import textwrap

import pytest

from nndoctor.findings import Severity
from nndoctor.registry import all_checks
from tests.conftest import FIXTURES, expected_lines, run_script
from tests.snapshot import assert_findings_snapshot

pytest.importorskip("keras")

KERAS_FIXTURES = FIXTURES / "keras"
BUGGY = sorted(KERAS_FIXTURES.glob("buggy_*.py"))
CORRECT = sorted(KERAS_FIXTURES.glob("correct_*.py"))
K_CHECKS = all_checks("keras")


def test_every_keras_check_has_a_buggy_fixture():
    # K105/K109 are custom-loop checks: their fixtures run on TensorFlow (tests/fixtures/keras_tf).
    tf_buggy = sorted((FIXTURES / "keras_tf").glob("buggy_*.py"))
    marked = {code for path in [*BUGGY, *tf_buggy] for code in expected_lines(path)}
    assert {c.code for c in K_CHECKS} <= marked
    assert {"K101", "K102", "K103", "K104", "K108"} <= {c.code for c in K_CHECKS}


@pytest.mark.parametrize("path", BUGGY, ids=lambda p: p.stem)
def test_buggy_fixture_fires_at_marked_line(path):
    for code, lines in expected_lines(path).items():
        report = run_script(path, select=[code])
        found = report.by_code(code)
        assert found, f"{code} did not fire on {path.name}: {report.internal_errors}"
        assert {f.location.line for f in found if f.location} & lines, [str(f.location) for f in found]
        assert all(f.location and f.location.path.endswith(path.name) for f in found)
        assert not report.internal_errors, report.internal_errors
        # What the user reads, word for word (tests/snapshot.py; update with --snapshot-update).
        assert_findings_snapshot(f"keras/{path.stem}.{code}", report.findings, base=KERAS_FIXTURES,
                                 source=f"nndoctor run --select {code} {path.name}")


@pytest.mark.parametrize("path", CORRECT, ids=lambda p: p.stem)
def test_correct_keras_program_is_silent(path):
    report = run_script(path)
    bad = [f for f in report.findings if f.severity >= Severity.WARNING]
    assert not bad, "\n".join(f"{f.code} {f.location}: {f.message}" for f in bad)
    assert report.status == "completed", report.traceback
    assert not report.internal_errors, report.internal_errors
    assert report.steps > 0


def test_messages_state_the_evidence():
    report = run_script(KERAS_FIXTURES / "buggy_logits_without_from_logits.py", select=["K102"])
    (finding,) = report.by_code("K102")
    assert "sparse_categorical_crossentropy" in finding.message and "span [" in finding.message
    assert finding.evidence["pred_min"] < 0 < 1 < finding.evidence["pred_max"]
    report = run_script(KERAS_FIXTURES / "buggy_channels_first.py", select=["K108"])
    (finding,) = report.by_code("K108")
    assert "(32, 3, 16, 16)" in finding.message and "buggy_channels_first.py:14" in finding.message


def test_evaluate_is_observed(tmp_path):
    script = tmp_path / "evaluate_only.py"
    script.write_text(textwrap.dedent("""\
        import os
        os.environ.setdefault("KERAS_BACKEND", "torch")
        import keras
        import numpy as np
        keras.utils.set_random_seed(0)
        x = np.random.default_rng(0).normal(size=(32, 6)).astype("float32")
        y = keras.utils.to_categorical(np.arange(32) % 3, 3)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy")
        try:
            model.evaluate(x, y, verbose=0)
        except ValueError:
            pass
        """))
    report = run_script(script, select=["K103"])
    (finding,) = report.by_code("K103")
    assert finding.location.line == 11 and "one-hot" in finding.message


def test_max_steps_stops_fit():
    report = run_script(KERAS_FIXTURES / "correct_softmax_default_loss.py", max_steps=2)
    assert report.status == "stopped" and report.steps == 2


def test_patches_are_undone():
    import sys

    import keras
    from keras.src.layers.convolutional.base_conv import BaseConv

    owners = (keras.Model, keras.layers.Layer, keras.layers.BatchNormalization, BaseConv)
    before = [dict(vars(owner)) for owner in owners]
    finders = list(sys.meta_path)
    report = run_script(KERAS_FIXTURES / "buggy_bn_momentum.py")
    assert report.by_code("K104")
    assert [dict(vars(owner)) for owner in owners] == before
    assert list(sys.meta_path) == finders
