"""`python -m nndoctor` started from a folder whose files carry standard modules' names
(inspect.py, argparse.py, json.py): nndoctor's own start-up must not import them, the script
must see the sys.path plain `python` gives it, and R102 must still name the shadowing file."""

from __future__ import annotations

import sys

import pytest

from tests import childproc

pytestmark = pytest.mark.e2e

POISON = "raise SystemExit('the local {name}.py was imported')\n"


def test_start_from_a_folder_with_inspect_py(tmp_path):
    # The working directory holds the poisoned names; so does the script's own folder.
    for name in ("inspect", "argparse", "json"):
        (tmp_path / f"{name}.py").write_text(POISON.format(name=name))
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "inspect.py").write_text(POISON.format(name="inspect"))
    (sub / "train.py").write_text("import os, sys\nprint('path0', sys.path[0])\n"
                                  "print('cwd on path', os.getcwd() in sys.path or '' in sys.path)\n")
    result = childproc.run([sys.executable, "-m", "nndoctor", "run", "--fail-on", "never", "sub/train.py"],
                            cwd=tmp_path, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "was imported" not in output
    # What `python sub/train.py` gives the script: its own folder first, not the working directory.
    assert f"path0 {sub}" in result.stdout and "cwd on path False" in result.stdout
    assert "R102 module-shadowing" in result.stderr and f"{sub.name}/inspect.py" in result.stderr.replace("\n", "")
