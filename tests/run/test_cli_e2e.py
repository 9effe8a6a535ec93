"""A few end-to-end tests that spawn the real `nndoctor` command (slow: each imports torch)."""

from __future__ import annotations

import json
import sys

import pytest

from tests import childproc
from tests.conftest import FIXTURES

pytestmark = pytest.mark.e2e


def nndoctor(*args, cwd=None):
    return childproc.run([sys.executable, "-m", "nndoctor", *args], cwd=cwd, timeout=300)


def test_run_reports_findings_writes_json_and_fails_on_error(tmp_path):
    out = tmp_path / "report.json"
    script = FIXTURES / "buggy" / "O102_zero_grad_between_backward_and_step.py"
    result = nndoctor("run", "--json", str(out), str(script), "--some-script-flag", "1")
    assert result.returncode == 1, result.stderr
    data = json.loads(out.read_text())
    assert data["status"] == "completed"
    assert data["command"][-2:] == ["--some-script-flag", "1"]
    assert "O102" in {f["code"] for f in data["findings"]}
    assert "O102 zero-grad-before-step" in result.stderr
    assert "O102_zero_grad_between_backward_and_step.py:13" in result.stderr


def test_crash_writes_json_and_shows_the_traceback(tmp_path):
    out = tmp_path / "report.json"
    result = nndoctor("run", "--json", str(out), "--fail-on", "never",
                      str(FIXTURES / "scripts" / "raises_value_error.py"))
    assert result.returncode == 3
    assert "ValueError: bad config train.yaml" in result.stderr
    assert json.loads(out.read_text())["status"] == "crashed"


def test_missing_script_is_a_clean_usage_error():
    result = nndoctor("run", "no_such_script.py")
    assert result.returncode == 2
    assert result.stderr.startswith("nndoctor: error: can't open file")
    assert "Traceback" not in result.stderr


def test_max_steps_and_dash_m(tmp_path):
    out = tmp_path / "r.json"
    result = nndoctor("run", "--max-steps", "2", "--json", str(out), "-m", "pkg_train", "9",
                      cwd=FIXTURES / "scripts")
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["status"] == "stopped" and data["steps"] == 2 and data["command"] == ["-m", "pkg_train", "9"]


def test_checks_prints_one_codes_documentation():
    result = nndoctor("checks", "M101")
    assert result.returncode == 0
    for heading in ("## What it does", "## Why is this bad?", "## Example", "## Use instead", "## References"):
        assert heading in result.stdout
    assert nndoctor("checks", "X999").returncode == 2


def test_demo_shows_at_least_three_problems(tmp_path):
    out = tmp_path / "demo.json"
    result = nndoctor("demo", "--json", str(out))
    assert result.returncode == 0, result.stderr
    codes = {f["code"] for f in json.loads(out.read_text())["findings"]}
    assert {"M101", "O101", "P108"} <= codes
    assert len(codes) >= 3
