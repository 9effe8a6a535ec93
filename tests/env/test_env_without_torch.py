"""``nndoctor env`` in an interpreter where PyTorch is not installed at all: a fresh virtual
environment (no site packages) that sees only nndoctor and the few pure-Python packages the
command needs, copied from this environment (no download)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests import childproc

# One worker runs the module-scoped subprocess, not each (tests/conftest.py: pytest -n distributes by group).
pytestmark = pytest.mark.xdist_group("env_without_torch")

SRC = Path(__file__).resolve().parents[2] / "src"
PURE_DEPENDENCIES = ("rich", "pygments", "markdown_it", "mdurl", "packaging")


@pytest.fixture(scope="module")
def torchless_python(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchless")
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(root / "venv")
    packages = root / "packages"
    packages.mkdir()
    for name in PURE_DEPENDENCIES:
        module = importlib.import_module(name)
        shutil.copytree(Path(module.__file__).parent, packages / name)
    # nndoctor's package without its egg-info: its own declared requirements (torch) would be unmet.
    shutil.copytree(SRC / "nndoctor", packages / "nndoctor", ignore=shutil.ignore_patterns("__pycache__"))
    python = root / "venv" / "bin" / "python"
    check = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True)
    assert check.returncode != 0 and "No module named 'torch'" in check.stderr
    return python, str(packages)


def test_env_runs_and_reports_without_pytorch(torchless_python, tmp_path):
    python, path = torchless_python
    env = {**os.environ, "PYTHONPATH": path, "PATH": "/usr/bin:/bin"}
    done = childproc.run([str(python), "-m", "nndoctor", "env", "--json", "-"], env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    frameworks = report["extra"]["environment"]["frameworks"]
    assert frameworks["torch"]["installed"] is False
    assert report["extra"]["environment"]["driver"]["present"] is False
    assert "torch: not installed" in done.stderr
    assert "Traceback" not in done.stderr


def test_explain_and_checks_run_without_pytorch(torchless_python, tmp_path):
    python, path = torchless_python
    env = {**os.environ, "PYTHONPATH": path}
    log = tmp_path / "log.txt"
    log.write_text("AssertionError: Torch not compiled with CUDA enabled\n")
    done = childproc.run([str(python), "-m", "nndoctor", "explain", str(log)], env=env, timeout=120)
    assert "V102 cpu-only-build" in done.stdout, done.stdout + done.stderr
    assert sys.version_info >= (3, 10)
