"""TensorFlow/Keras crash fixtures (tests/fixtures/crash/tensorflow) raise their real errors under
the engine and are explained with the right code at the marked line, with the key evidence of
the live run; the correct program there finishes with no explanation.

All fixtures run in ONE subprocess (``tf_crash_runner``): TensorFlow's import costs seconds
and Keras's backend is fixed per process (this suite's processes use the torch backend). It is
the TensorFlow child shared with the other modules of ``tests/tf_process.py``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests import tf_process
from tests.conftest import FIXTURES, expected_lines

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed"),
              # one worker runs the shared TensorFlow child, not each (tests/conftest.py: pytest -n distributes by group)
              pytest.mark.xdist_group(tf_process.GROUP),
              # slow by hand: durations.json books the child's seconds on whichever module of the group ran first
              pytest.mark.slow]

TF_CRASH = FIXTURES / "crash" / "tensorflow"


def tf_crash_fixtures() -> list[Path]:
    return sorted(p for p in TF_CRASH.glob("*.py") if expected_lines(p))


CORRECT = sorted(TF_CRASH.glob("correct_*.py"))

EVIDENCE = {
    "E105_tf_matmul": lambda f: f["evidence"]["input_shape"] == [4, 16] and f["evidence"]["weight_shape"] == [8, 3],
    "E108_tf_host_oom": lambda f: (f["evidence"]["tensor_shape"] == [1 << 20, 1 << 20, 64]
                                   and f["evidence"]["tensor_bytes"] == (1 << 40) * 256
                                   and "host memory" in f["message"] and "256.0 TiB" in f["message"]),
    "E117_one_based_labels_keras": lambda f: (f["evidence"]["batch_label_range"] == [1, 3]
                                              and f["evidence"]["classes"] == 3 and "y - 1" in f["fix"]),
    "E133_argmax_in_fit": lambda f: (f["evidence"]["variables"] == ["scores/kernel", "scores/bias"]
                                     and "ArgMax in layer 'to_class'" in f["message"]),
    "E133_numpy_in_tape": lambda f: (f["evidence"]["source_blockers"] == ["line 14: np.asarray(logits)"]
                                     and len(f["evidence"]["variables"]) == 2 and "NumPy" in f["message"]),
    "E134_channels_first_images": lambda f: (f["evidence"]["found_shape"] == [32, 1, 28, 28]
                                             and f["evidence"]["layer_class"] == "Conv2D"
                                             and "channels-first" in f["message"] and "(0, 2, 3, 1)" in f["fix"]),
    "E135_tfrecord_odd_records": lambda f: (f["evidence"]["stored_lengths"] == {"4": 8, "8": 2}
                                            and "train.tfrecord#3" in f["message"] and "train.tfrecord#7" in f["message"]
                                            and "F202" in f["message"]),
}


@pytest.fixture(scope="module")
def results(request) -> dict:
    data = tf_process.read_json(request, "crashes")
    assert sorted(data) == sorted(str(p) for p in tf_crash_fixtures() + CORRECT)  # the runner ran these
    return data


@pytest.mark.parametrize("path", tf_crash_fixtures(), ids=lambda p: p.stem)
def test_tf_crash_is_explained_at_the_marked_line(results, path):
    (code, lines), = expected_lines(path).items()
    result = results[str(path)]
    assert result["status"] == "crashed" and result["traceback"]
    explanations = [f for f in result["findings"] if f["code"][0] in "EV"]
    assert [f["code"] for f in explanations] == [code], explanations
    finding = explanations[0]
    assert finding["path"].endswith(path.name) and finding["line"] in lines, finding
    assert EVIDENCE[path.stem](finding), finding
    assert result["crash"]["explained_by"] == code
    assert result["internal_errors"] == []


@pytest.mark.parametrize("path", CORRECT, ids=lambda p: p.stem)
def test_correct_tf_program_gets_no_explanation(results, path):
    result = results[str(path)]
    assert result["status"] == "completed", result
    assert [f for f in result["findings"] if f["code"][0] in "EV"] == []
    assert result["internal_errors"] == []


def test_every_tf_code_has_a_fixture():
    covered = {code for p in tf_crash_fixtures() for code in expected_lines(p)}
    assert {"E105", "E108", "E117", "E133", "E134", "E135"} <= covered
