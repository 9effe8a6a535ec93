"""The public import paths from before the packages (issue 34) still work, lazily."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("old", "new"), [
    ("nndoctor.pytest_plugin", "nndoctor.integrations.pytest_plugin"),
    ("nndoctor.lightning", "nndoctor.integrations.lightning"),
    ("nndoctor.transformers", "nndoctor.integrations.transformers"),
])
def test_old_path_is_the_new_module(old, new):
    framework = new.rpartition(".")[2]
    if framework != "pytest_plugin":
        pytest.importorskip(framework)
    assert importlib.import_module(old) is importlib.import_module(new)


def test_old_from_import_gives_the_same_class():
    pytest.importorskip("lightning")
    from nndoctor.lightning import DoctorCallback as old

    from nndoctor.integrations.lightning import DoctorCallback as new

    assert old is new


def test_unknown_names_are_still_missing():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("nndoctor.no_such_module")


def test_pytest_entry_point_names_the_new_module():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'nndoctor = "nndoctor.integrations.pytest_plugin"' in pyproject.split("[project.entry-points.pytest11]")[1]
    assert 'nndoctor = "nndoctor.cli:main"' in pyproject.split("[project.scripts]")[1]


def test_import_nndoctor_imports_no_integration():
    code = ("import sys, nndoctor; print(sorted(m for m in sys.modules if m.startswith('nndoctor.integrations')"
            " or m in ('lightning', 'transformers', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")}).stdout
    assert out.strip() == "[]"
