"""Keras on the TensorFlow backend and TF2 custom loops.

Keras picks its backend at its first import, and this test session imports it on the torch
backend (tests/conftest.py). So every TensorFlow-backend program runs in ONE subprocess
(``tests/keras/tf_backend_runner.py``: the shared Keras fixtures, the TensorFlow-only
custom-loop fixtures, the observer-rule runs and the patch check), and the tests below
check the JSON it writes. Measured: about 25-40 s of CPU for the whole module. The subprocess
is the TensorFlow child shared with the other modules of ``tests/tf_process.py`` (one
TensorFlow import for all of them).
"""

from __future__ import annotations

import pytest

from nndoctor.core.findings import Severity
from nndoctor.core.probes import KERAS_PROBES, KERAS_SCOPES
from nndoctor.core.registry import all_checks, framework_checks
from tests import tf_process
from tests.conftest import FIXTURES, expected_lines, needs

# One worker runs the shared TensorFlow child, not each (tests/conftest.py: pytest -n distributes by group).
# Slow by hand: durations.json books the child's seconds on whichever module of the group ran first.
pytestmark = [needs("tensorflow"), needs("keras"), pytest.mark.xdist_group(tf_process.GROUP), pytest.mark.slow]


SHARED = sorted((FIXTURES / "keras").glob("buggy_*.py")) + sorted((FIXTURES / "keras").glob("correct_*.py"))
TF_ONLY = sorted((FIXTURES / "keras_tf").glob("buggy_*.py")) + sorted((FIXTURES / "keras_tf").glob("correct_*.py"))
PROGRAMS = SHARED + TF_ONLY


@pytest.fixture(scope="module")
def results(request):
    data = tf_process.read_json(request, "backend")
    assert data["backend"] == "tensorflow"
    return data


def _key(path) -> str:
    return f"{path.parent.name}/{path.name}"


def test_every_loop_check_has_a_tf_buggy_fixture():
    marked = {code for path in TF_ONLY if path.name.startswith("buggy_") for code in expected_lines(path)}
    assert {"K105", "K109"} <= marked
    assert {"K105", "K109"} <= {c.code for c in all_checks("keras")}


@pytest.mark.parametrize("path", [p for p in PROGRAMS if p.name.startswith("buggy_")], ids=_key)
def test_buggy_fixture_fires_at_marked_line_on_tensorflow(results, path):
    for code, result in results["fixtures"][_key(path)].items():
        found = [f for f in result["findings"] if f["code"] == code]
        assert found, f"{code} did not fire on {path.name}: {result['internal_errors']} {result['traceback']}"
        assert {f["line"] for f in found} & set(result["lines"]), [(f["path"], f["line"]) for f in found]
        assert all(f["path"] and f["path"].endswith(path.name) for f in found)
        assert not result["internal_errors"], result["internal_errors"]


@pytest.mark.parametrize("path", [p for p in PROGRAMS if p.name.startswith("correct_")], ids=_key)
def test_correct_program_is_silent_on_tensorflow(results, path):
    result = results["fixtures"][_key(path)]
    bad = [f for f in result["findings"] if f["severity"] >= Severity.WARNING]
    assert not bad, "\n".join(f"{f['code']} {f['path']}:{f['line']}: {f['message']}" for f in bad)
    assert result["status"] == "completed", result["traceback"]
    assert not result["internal_errors"], result["internal_errors"]
    assert result["steps"] > 0


def test_custom_loop_steps_are_counted_and_max_steps_stops_a_tf_function_loop(results):
    result = results["max_steps"]
    assert result["status"] == "stopped" and result["steps"] == 3
    loop = results["fixtures"]["keras_tf/correct_custom_loop.py"]
    assert loop["steps"] == 4 * 6  # 4 epochs of 6 tf.function steps


@pytest.mark.parametrize("script", ["observer_training.py", "observer_custom_loop.py", "observer_nan_loop.py"])
def test_seeded_tensorflow_runs_are_identical_under_nndoctor(results, script):
    result = results["observer"][script]
    assert result["report"]["status"] == "completed" and result["report"]["steps"] > 0
    assert not result["report"]["internal_errors"], result["report"]["internal_errors"]
    assert result["arrays"] > 5 and result["different"] == []
    if script == "observer_nan_loop.py":  # the N101 layer walk ran on the failing batch
        (nan,) = [f for f in result["report"]["findings"] if f["code"] == "N101"]
        assert nan["evidence"]["failing_batch"] is True and nan["evidence"]["layer_inputs_finite"] is False


def test_patches_are_undone_after_tensorflow_runs(results):
    assert results["patches_undone"]


def test_each_selection_installs_exactly_the_probes_its_keras_checks_need(results):
    from nndoctor.keras.probes import keras_probes
    from nndoctor.tfdata.instrument import tfdata_probes

    assert {entry.name for entry in keras_probes("tensorflow") + tfdata_probes()} == set(KERAS_PROBES)
    for key, installed in results["probes"].items():
        select = key.split(",") if key else []
        needed = {name for scope in KERAS_SCOPES for cls in framework_checks(scope, select) for name in cls.needs}
        assert set(installed) == needed, key
    assert results["probes"][""] == sorted(KERAS_PROBES)  # every check: every probe, the graph probe too
    assert "tf_graph_stats" in results["probes"]["K101"]
    assert results["probes"]["K109"] == []  # its events come from the observer's core
    assert results["probes"]["O104"] == ["gradient_norms"]


def test_messages_name_the_evidence(results):
    (retrace,) = results["fixtures"]["keras_tf/buggy_retracing.py"]["K109"]["findings"]
    assert "argument 'lr'" in retrace["message"] and "float 0.095" in retrace["message"]
    assert retrace["evidence"]["varying_arguments"] == ["lr"]
    assert retrace["evidence"]["traces"] == retrace["evidence"]["calls"] >= 7
    assert "buggy_retracing.py:17" in retrace["message"]  # where the tf.function is defined
    (flag,) = results["fixtures"]["keras_tf/buggy_missing_training_flag.py"]["K105"]["findings"]
    assert "without training=" in flag["message"] and "updates 6 of its variables" in flag["message"]
    # Layer names carry a per-process counter (the runner runs many fixtures): compare the kinds.
    assert [entry.split()[0] for entry in flag["evidence"]["mode_layers"]] == ["BatchNormalization", "Dropout"]
