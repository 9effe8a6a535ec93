"""The pytest plugin: the ``nndoctor`` fixture and marker, run in an inner pytest (pytester).

In a subprocess: an in-process inner pytest drops the torch submodules it imported, and
torch cannot import them twice."""

from __future__ import annotations

from pathlib import Path

import nndoctor.integrations.pytest_plugin

pytest_plugins = ["pytester"]

TRAINING = '''
import pytest
import torch
import torch.nn as nn


def train(steps, zero_grad=True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=generator)
        y = (x[:, 0] > 0).long()
        if zero_grad:
            optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
'''


def _plugin_args(request) -> list[str]:
    # Installed, the entry point loads the plugin already; from a source tree, name it.
    manager = request.config.pluginmanager
    return [] if manager.is_registered(nndoctor.integrations.pytest_plugin) else ["-p", "nndoctor.integrations.pytest_plugin"]


def test_fixture_and_marker_pass_clean_training_and_fail_planted_bugs(pytester, request):
    """One inner pytest run (each costs a torch import): four fixture/marker cases."""
    pytester.makepyfile(TRAINING + '''

def test_fixture_clean(nndoctor):
    train(6)
    nndoctor.assert_clean()
    assert nndoctor.report.steps == 6


def test_fixture_forgot_zero_grad(nndoctor):
    train(6, zero_grad=False)
    nndoctor.assert_clean()


@pytest.mark.nndoctor
def test_marker_clean():
    train(6)


@pytest.mark.nndoctor(fail_on="error")
def test_marker_forgot_zero_grad():
    train(6, zero_grad=False)


@pytest.mark.nndoctor(ignore=["O101"])
def test_marker_ignored():
    train(6, zero_grad=False)


def test_unmarked_is_not_watched():
    train(6, zero_grad=False)
''')
    result = pytester.runpytest_subprocess(*_plugin_args(request), "-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines([
        "*FindingsReachedFailOn: nndoctor: * finding(s) at warning or above:*",
        "*nndoctor error O101 missing-zero-grad at *.py:16: Gradients from the previous SGD.step()*",
    ])
    failed = [line for line in result.stdout.lines if line.startswith("FAILED")]
    assert sorted(line.split("::")[1].split(" ")[0] for line in failed) == [
        "test_fixture_forgot_zero_grad", "test_marker_forgot_zero_grad"]


def test_entry_point_is_declared():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '[project.entry-points.pytest11]\nnndoctor = "nndoctor.integrations.pytest_plugin"\n' in pyproject
