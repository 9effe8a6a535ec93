"""A real observed run with history, shared by the HTML and TensorBoard tests."""

from __future__ import annotations

import os
import textwrap

import pytest

TRAIN = textwrap.dedent('''\
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = [(torch.randn(16, 8) * 40 + 100, torch.randint(0, 3, (16,))) for _ in range(6)]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.cat([x for x, _ in data]), torch.cat([y for _, y in data])), batch_size=16)
    for epoch in range(4):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
    ''')


@pytest.fixture(scope="module")
def observed_report(tmp_path_factory):
    """Report of a run with a planted bug (missing zero_grad) and its recorded history."""
    from nndoctor.core.engine import Session
    from nndoctor.run.history import attach
    from nndoctor.run.runner import Target, run_target

    folder = tmp_path_factory.mktemp("observed")
    script = folder / "train.py"
    script.write_text(TRAIN)
    session = Session(command=["train.py"])
    attach(session)
    cwd = os.getcwd()
    try:
        report = run_target(Target(str(script), []), session)
    finally:
        os.chdir(cwd)
    assert "O101" in report.codes(), [f.code for f in report.findings]
    return report
