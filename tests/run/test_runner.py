"""`nndoctor run` behaves like `python SCRIPT ARGS` in every outcome, and always reports."""

from __future__ import annotations

import json
import sys

import pytest

from nndoctor.core.engine import Session
from nndoctor.run.cli import exit_status
from nndoctor.run.runner import Target, run_target
from nndoctor.util.errors import UsageError
from tests.conftest import FIXTURES, run_script

SCRIPTS = FIXTURES / "scripts"


def test_script_sees_its_argv_name_path_and_callers_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "seen.json"
    report = run_script(SCRIPTS / "argv_and_name.py", [str(out), "--lr", "0.1"])
    seen = json.loads(out.read_text())
    assert seen["argv"] == [str(SCRIPTS / "argv_and_name.py"), str(out), "--lr", "0.1"]
    assert seen["name"] == "__main__"
    assert seen["cwd"] == str(tmp_path)
    assert seen["path0"] == str(SCRIPTS)
    assert report.status == "completed" and report.steps == 0


def test_sys_argv_and_path_are_restored():
    argv, path0 = sys.argv[:], sys.path[0]
    run_script(SCRIPTS / "never_trains.py")
    assert sys.argv == argv and sys.path[0] == path0


def test_sys_exit_code_is_kept():
    report = run_script(SCRIPTS / "exits_with_code.py")
    assert report.exit_code == 7
    assert exit_status(report, None) == 7


def test_crash_is_reported_with_the_users_traceback():
    report = run_script(SCRIPTS / "raises_value_error.py")
    assert report.status == "crashed"
    assert "ValueError: bad config train.yaml" in report.traceback
    assert "raises_value_error.py" in report.traceback
    assert "nndoctor" not in report.traceback.replace(str(FIXTURES), "")
    assert "runpy" not in report.traceback
    assert exit_status(report, None) == 3


def test_keyboard_interrupt_gives_a_partial_report():
    report = run_script(SCRIPTS / "interrupted.py")
    assert report.status == "interrupted"
    assert report.steps == 3
    assert exit_status(report, None) == 130


def test_max_steps_stops_cleanly():
    report = run_script(SCRIPTS / "long_training.py", max_steps=5)
    assert report.status == "stopped"
    assert report.steps == 5
    assert exit_status(report, None) == 0


def test_script_that_never_trains_says_so_instead_of_no_problems():
    report = run_script(SCRIPTS / "never_trains.py")
    assert report.status == "completed" and report.steps == 0
    assert [(f.code, f.severity.name) for f in report.findings] == [("R105", "INFO")]


@pytest.mark.parametrize("name, message", [
    ("does_not_exist.py", "no such file"),
    ("syntax_error.py", "syntax error in"),
])
def test_unrunnable_scripts_are_usage_errors(name, message):
    with pytest.raises(UsageError, match=message):
        run_target(Target(str(SCRIPTS / name), []), Session())


def test_run_module_with_dash_m(monkeypatch):
    monkeypatch.chdir(SCRIPTS)  # like `python -m`, the module is found from the working directory
    session = Session()
    report = run_target(Target("pkg_train", ["4"], is_module=True), session)
    assert report.status == "completed" and report.steps == 4
    assert report.command == ["-m", "pkg_train", "4"]


def test_missing_module_is_a_usage_error():
    with pytest.raises(UsageError, match="no module named"):
        run_target(Target("surely_not_a_module_xyz", [], is_module=True), Session())


def test_fail_on_threshold_decides_the_exit_status():
    from nndoctor.core.findings import Severity

    report = run_script(FIXTURES / "buggy" / "O103_step_without_backward.py", select=["O103"])
    assert report.worst() == Severity.WARNING
    assert exit_status(report, Severity.ERROR) == 0
    assert exit_status(report, Severity.WARNING) == 1
    assert exit_status(report, None) == 0


def test_select_and_ignore_filter_checks():
    path = FIXTURES / "buggy" / "M103_head_replaced_after_optimizer.py"
    assert run_script(path, select=["M104"]).codes() == {"M104"}
    assert "M104" not in run_script(path, ignore=["M104"]).codes()
    assert run_script(path, select=["O"]).codes() == set()


def test_terminal_shows_the_head_of_an_internal_error():
    from nndoctor.report.terminal import _first_sentence

    oom = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity "
           "of 139.80 GiB of which 867.12 MiB is free.\nIf reserved but unallocated memory is large ...")
    assert _first_sentence(oom) == "OutOfMemoryError: CUDA out of memory."
    assert _first_sentence("KeyError: 'x'") == "KeyError: 'x'"
    long = _first_sentence("ValueError: " + "a" * 300)
    assert len(long) == 160 and long.endswith("…")
