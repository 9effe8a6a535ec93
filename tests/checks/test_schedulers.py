"""O107 with wrapped optimizers: accelerate's AcceleratedOptimizer is the optimizer it wraps."""

from __future__ import annotations

import pytest
import torch

from nndoctor.core.findings import Severity
from nndoctor.core.optimizers import unwrap_optimizer
from tests.conftest import FIXTURES, run_script

SCRIPT = FIXTURES / "scripts" / "accelerate_scheduler.py"
pytest.importorskip("accelerate")


@pytest.mark.parametrize("when", ["before", "after"])
def test_no_o107_when_the_scheduler_steps_after_an_accelerated_optimizer(when):
    report = run_script(SCRIPT, [when], select=["O107"])
    assert report.status == "completed", report.traceback
    assert report.steps == 8
    assert not report.by_code("O107"), [f.message for f in report.findings]
    assert not report.internal_errors


@pytest.mark.parametrize("when", ["before", "after"])
def test_o107_still_fires_when_the_scheduler_steps_first(when):
    report = run_script(SCRIPT, [when, "swap"], select=["O107"])
    found = report.by_code("O107")
    assert found and found[0].severity == Severity.ERROR
    assert found[0].location.path.endswith("accelerate_scheduler.py")


def test_unwrap_follows_optimizer_chains():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    _, wrapped = accelerator.prepare(model, inner)
    assert wrapped is not inner and unwrap_optimizer(wrapped) is inner
    assert unwrap_optimizer(inner) is inner


def test_o107_is_one_severity():
    from nndoctor.core.registry import all_checks

    check = next(c for c in all_checks() if c.code == "O107")
    report = run_script(FIXTURES / "buggy" / "O107_scheduler_before_optimizer.py", select=["O107"])
    assert {f.severity for f in report.by_code("O107")} == {check.severity}
