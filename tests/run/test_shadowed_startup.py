"""`python -m nndoctor` started from a folder whose files carry standard modules' names
(inspect.py, argparse.py, json.py): nndoctor's own start-up must not import them, the script
must see the sys.path plain `python` gives it, and R102 must still name the shadowing file."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

POISON = "raise SystemExit('the local {name}.py was imported')\n"


def nndoctor(*args, cwd):
    return subprocess.run([sys.executable, "-m", "nndoctor", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_run_from_a_folder_with_inspect_py(tmp_path):
    for name in ("inspect", "argparse", "json"):
        (tmp_path / f"{name}.py").write_text(POISON.format(name=name))
    (tmp_path / "train.py").write_text("import sys, os\nprint('path0', sys.path[0])\n"
                                       "print('cwd on path', '' in sys.path)\n")
    result = nndoctor("run", "--fail-on", "never", "train.py", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "was imported" not in output
    assert f"path0 {tmp_path}" in result.stdout  # what `python train.py` gives the script
    assert "R102 module-shadowing" in result.stderr and "inspect.py" in result.stderr


def test_script_in_a_subfolder_gets_its_own_folder_first(tmp_path):
    (tmp_path / "inspect.py").write_text(POISON.format(name="inspect"))
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "train.py").write_text("import os, sys\nprint('path0', sys.path[0])\n"
                                  "print('cwd on path', os.getcwd() in sys.path or '' in sys.path)\n")
    result = nndoctor("run", "--fail-on", "never", "sub/train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"path0 {sub}" in result.stdout and "cwd on path False" in result.stdout
