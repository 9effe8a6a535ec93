"""The linter, the dependency check and the type checker, as tests of the suite.

They used to run one after the other before pytest in the README's test command: ~20 s on one
core of the 2-core machine while the other waited. As tests, ``pytest -n 3`` runs them beside
the others (mypy alone is ~12 CPU-seconds cold), and a lint failure no longer hides the test
results. Each runs the tool the ``[dev]`` extra installs, from this interpreter, on the files
and settings of ``pyproject.toml``, in a subprocess (as a contributor types it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(*command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0 and f"No module named {command[0]}" in done.stderr:
        pytest.fail(f"{command[0]} is not installed: pip install -e '.[dev]'")
    return done


def test_ruff_finds_nothing_in_src_and_tests():
    done = _tool("ruff", "check", "src", "tests")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_deptry_every_import_of_src_is_declared():
    done = _tool("deptry", "src")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_mypy_finds_no_type_error():
    done = _tool("mypy")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
