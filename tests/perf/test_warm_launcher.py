"""perf's warm launcher: a re-run forked from a helper that has torch imported behaves like
``python -m CHILD ARGS`` run afresh (arguments, working directory, environment, stdin, output,
return code), and a re-run that outlives its timeout is killed without losing the helper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nndoctor.commands.perf import warm_launcher
from nndoctor.commands.perf.rerun import _launch

pytestmark = [pytest.mark.skipif(not hasattr(os, "fork"), reason="forks"),
              pytest.mark.slow]  # the helper imports torch: seconds

CHILD = "tests.perf.echo_child"
ROOT = Path(__file__).resolve().parents[2]


def _env_with_tests() -> dict[str, str]:
    """Our environment with this checkout on PYTHONPATH (nndoctor's -m startup drops the working
    directory from sys.path, so ``tests.perf.echo_child`` is found through it)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path)


@pytest.fixture(scope="module")
def launcher():
    started = warm_launcher.WarmLauncher(CHILD, _env_with_tests())
    yield started
    started.close()


def _run(launcher, tmp_path, mode, timeout=120.0):
    out, log = tmp_path / "out.json", tmp_path / "log.txt"
    code = launcher.run([mode, str(out)], str(tmp_path), str(log), timeout)
    return code, (json.loads(out.read_text()) if out.exists() else None), log.read_text()


def test_a_forked_rerun_gets_the_callers_context(launcher, tmp_path, monkeypatch):
    monkeypatch.setenv("WARM_TEST_MARKER", "set after the helper started")
    monkeypatch.setenv("PYTHONPATH", _env_with_tests()["PYTHONPATH"])
    code, seen, log = _run(launcher, tmp_path, "return")
    assert code == 5
    assert seen["argv"] == seen["sys_argv"] == ["return", str(tmp_path / "out.json")]
    assert seen["cwd"] == str(tmp_path)
    assert seen["marker"] == "set after the helper started"
    assert seen["stdin"] == ""  # /dev/null, never the helper's request pipe
    assert seen["torch_loaded"] is True  # the point: imported once, in the helper
    # torch._dynamo too (every script that builds an optimizer imports it: 1.4-2 s a re-run),
    # and neither import left a CUDA context or a second thread for the fork to inherit.
    assert seen["dynamo_loaded"] is True and seen["cuda_initialized"] is False
    assert seen["threads"] in (None, 1)
    assert "to stdout" in log and "to stderr" in log


@pytest.mark.parametrize(("mode", "expected"), [("exit", 3), ("raise", 1), ("signal", -9)])
def test_the_return_code_is_what_a_fresh_process_would_give(launcher, tmp_path, mode, expected):
    code, _, log = _run(launcher, tmp_path, mode)
    assert code == expected
    if mode == "raise":
        assert "ValueError: the child failed" in log


def test_a_rerun_past_its_timeout_is_killed_and_the_helper_stays_usable(launcher, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        _run(launcher, tmp_path, "hang", timeout=3.0)
    assert _run(launcher, tmp_path, "return")[0] == 5


def test_disabled_or_unknown_children_run_in_a_fresh_process(tmp_path, monkeypatch):
    assert not warm_launcher.enabled(CHILD)  # only the torch re-run child is forked
    monkeypatch.setenv("NNDOCTOR_TRY_WARM", "0")
    monkeypatch.setenv("PYTHONPATH", _env_with_tests()["PYTHONPATH"])
    assert not warm_launcher.enabled("nndoctor.commands.perf.torch.rerun_child")
    out, log = tmp_path / "out.json", tmp_path / "log.txt"
    code = _launch([sys.executable, "-m", CHILD, "return", str(out)], CHILD, str(tmp_path), str(log))
    assert code == 5 and json.loads(out.read_text())["torch_loaded"] is False
