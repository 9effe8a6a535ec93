"""The run history behind the HTML/TensorBoard reports: bounded, and the patient unchanged."""

from __future__ import annotations

import os
import runpy
import sys

import pytest

from nndoctor.run.history import MAX_LAYERS, LayerSeries, Series
from tests.conftest import FIXTURES


def test_series_stays_bounded_and_covers_the_whole_run():
    series = Series(limit=100)
    for step in range(1_000_000):
        series.add(step, float(step))
    assert 50 <= len(series) <= 100
    assert series.steps[0] == 0 and series.steps[-1] > 990_000
    gaps = {b - a for a, b in zip(series.steps, series.steps[1:])}
    assert len(gaps) == 1  # evenly spread


def test_layer_series_keeps_at_most_max_layers():
    layers = LayerSeries()
    for i in range(MAX_LAYERS + 10):
        layers.add(f"layer{i}", 0, 1.0)
    assert len(layers.layers) == MAX_LAYERS


SCRIPT = FIXTURES / "scripts" / "observer_training.py"


def test_recording_history_leaves_training_bit_identical(tmp_path):
    torch = pytest.importorskip("torch")
    from nndoctor.core.engine import Session
    from nndoctor.run.history import attach
    from nndoctor.run.runner import Target, run_target

    plain, doctored = tmp_path / "plain.pt", tmp_path / "doctored.pt"
    saved = sys.argv[:]
    sys.argv = [str(SCRIPT), str(plain), ""]
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = saved
    session = Session()
    history = attach(session)
    cwd = os.getcwd()
    try:
        report = run_target(Target(str(SCRIPT), [str(doctored), ""]), session)
    finally:
        os.chdir(cwd)
    assert report.status == "completed" and not report.internal_errors
    assert len(history.loss) == report.steps and len(history.update_ratios.layers) > 0
    a, b = torch.load(plain), torch.load(doctored)
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
    assert torch.equal(a["next_draw"], b["next_draw"])
