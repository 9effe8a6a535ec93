"""The observer rules of the engine: everything undone, nothing retained, internal errors contained."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import torch
import torch.nn as nn

import nndoctor
from nndoctor.core.engine import Session
from nndoctor.core.events import StepStart
from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check
from tests.conftest import FIXTURES, run_script


def _torch_surface():
    from torch.nn.modules import module as module_mod
    from torch.optim import optimizer as optimizer_mod
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return {
        "forward_hooks": len(module_mod._global_forward_hooks),
        "forward_pre_hooks": len(module_mod._global_forward_pre_hooks),
        "step_pre": len(optimizer_mod._global_optimizer_pre_hooks),
        "step_post": len(optimizer_mod._global_optimizer_post_hooks),
        "call": nn.Module.__call__,
        "train": nn.Module.train, "zero_grad": torch.optim.Optimizer.zero_grad,
        "module_zero_grad": nn.Module.zero_grad, "backward": torch.Tensor.backward,
        "autograd_backward": torch.autograd.backward, "ce": torch.nn.functional.cross_entropy,
        "iter": DataLoader.__iter__, "next": _BaseDataLoaderIter.__next__,
        "save": torch.save, "load": torch.load, "load_state_dict": nn.Module.load_state_dict,
        "sched": torch.optim.lr_scheduler.LRScheduler.step,
        "plateau": torch.optim.lr_scheduler.ReduceLROnPlateau.step,
        "add_param_group": torch.optim.Optimizer.add_param_group,
    }


def test_no_hook_or_patch_left_behind():
    before = _torch_surface()
    run_script(FIXTURES / "correct" / "classifier_train_val.py")
    run_script(FIXTURES / "scripts" / "raises_value_error.py")
    run_script(FIXTURES / "scripts" / "long_training.py", max_steps=3)
    assert _torch_surface() == before


def test_no_reference_to_the_users_model_is_retained():
    with nndoctor.watch() as report:
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,)))
            loss.backward()
            optimizer.step()
        refs = [weakref.ref(model), weakref.ref(optimizer), weakref.ref(loss)]
        del model, optimizer, loss
    gc.collect()
    assert report.steps == 4
    assert all(r() is None for r in refs)


class _Exploding(Check):
    """
    ## What it does
    Test double.
    ## Why is this bad?
    -
    ## Example
    -
    ## Use instead
    -
    ## References
    -
    """

    code = "Z999"
    name = "exploding-test-check"
    severity = Severity.ERROR
    summary = "raises inside its handler"
    fix = "-"

    def on_step_start(self, event: StepStart) -> None:
        raise RuntimeError("bug inside a check")


def test_a_failing_check_is_an_internal_error_not_a_crash():
    from nndoctor.run.runner import Target, run_target

    report = run_target(Target(str(FIXTURES / "scripts" / "long_training.py"), []),
                        Session(checks=[_Exploding], max_steps=20))
    assert report.status == "stopped" and report.steps == 20
    assert len(report.internal_errors) == 1  # disabled after its first failure
    assert "bug inside a check" in report.internal_errors[0].error
    data = report.to_json("x")
    assert data["internal_errors"][0]["where"].startswith("Z999")


def test_watch_reports_and_reraises_the_users_exception():
    import pytest

    with pytest.raises(ZeroDivisionError):
        with nndoctor.watch() as report:
            _ = 1 / 0
    assert report.status == "crashed"
    assert "ZeroDivisionError" in report.traceback


def test_watch_max_steps_ends_the_block_quietly():
    with nndoctor.watch(max_steps=2) as report:
        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(10):
            optimizer.zero_grad()
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
    assert report.status == "stopped" and report.steps == 2


def test_findings_merge_by_code_and_place():
    report = run_script(FIXTURES / "buggy" / "O102_zero_grad_between_backward_and_step.py", select=["O102"])
    (finding,) = report.by_code("O102")
    assert finding.count == 5 and finding.first_step == 0


def test_json_report_schema():
    report = run_script(FIXTURES / "buggy" / "M101_no_eval_in_validation.py")
    data = report.to_json(nndoctor.__version__)
    assert set(data) >= {"tool", "version", "schema", "command", "status", "steps", "findings", "internal_errors"}
    assert data["tool"] == "nndoctor" and data["schema"] == 1 and data["status"] == "completed"
    finding = next(f for f in data["findings"] if f["code"] == "M101")
    assert set(finding) == {"code", "name", "severity", "message", "location", "count", "first_step",
                            "evidence", "fix"}
    assert finding["location"]["path"].endswith("M101_no_eval_in_validation.py")
    assert finding["severity"] == "error" and finding["name"] == "eval-in-train-mode"


def test_torch_warnings_raised_through_our_wrappers_point_at_the_users_line(tmp_path):
    import warnings

    script = tmp_path / "sched_first.py"
    script.write_text(
        "import torch, torch.nn as nn\n"
        "model = nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "sched = torch.optim.lr_scheduler.StepLR(opt, 1)\n"
        "for step in range(2):\n"
        "    sched.step()\n"  # line 6: torch warns at the caller of step()
        "    loss = nn.functional.mse_loss(model(torch.randn(4, 2)), torch.randn(4))\n"  # line 7
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = warnings.showwarning
        run_script(script)
        after = warnings.showwarning
    located = {(Path(w.filename).name, w.lineno) for w in caught if issubclass(w.category, UserWarning)}
    assert ("sched_first.py", 6) in located and ("sched_first.py", 7) in located
    assert not [w for w in caught if "nndoctor" in w.filename]
    assert after is before  # the relay is gone with the session


def test_p108_names_the_running_sum_inside_a_function_and_its_line(tmp_path):
    script = tmp_path / "ema_loss.py"
    script.write_text(
        "import torch, torch.nn as nn\n"
        "def train():\n"
        "    model = nn.Linear(4, 2)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))\n"
        "    smooth = None\n"
        "    for step in range(8):\n"
        "        loss = nn.functional.cross_entropy(model(x), y)\n"
        "        opt.zero_grad(); loss.backward(); opt.step()\n"
        "        smooth = loss if smooth is None else 0.9 * smooth + 0.1 * loss\n"  # line 10
        "train()\n"
    )
    report = run_script(script, select=["P108"])
    (finding,) = report.by_code("P108")
    assert finding.evidence["kept"] == "graphs" and finding.evidence["holder"] == "smooth"
    assert finding.location.line == 10 and "`smooth += loss`" in finding.message


def test_p108_graph_tokens_leave_no_trace_on_a_correct_loop(tmp_path):
    script = tmp_path / "item_sum.py"
    script.write_text(
        "import torch, torch.nn as nn\n"
        "model = nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))\n"
        "running = 0.0\n"
        "for step in range(8):\n"
        "    loss = nn.functional.cross_entropy(model(x), y)\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    running += loss.item()\n"
    )
    report = run_script(script, select=["P108"])
    assert not report.by_code("P108") and not report.internal_errors


def test_p108_naming_the_holder_keeps_no_local_of_the_users_alive(tmp_path):
    out = tmp_path / "alive.txt"
    script = tmp_path / "loop_in_function.py"
    script.write_text(
        "import gc, weakref, torch, torch.nn as nn\n"
        "BATCHES = []\n"
        "def train():\n"
        "    model = nn.Linear(4, 2)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    running = 0.0\n"
        "    for step in range(8):\n"
        "        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))\n"
        "        BATCHES.append(weakref.ref(x))\n"
        "        loss = nn.functional.cross_entropy(model(x), y)\n"
        "        opt.zero_grad(); loss.backward(); opt.step()\n"
        "        running += loss\n"
        "    running = x = y = loss = None\n"
        "    gc.collect()\n"
        f"    open({str(out)!r}, 'w').write(repr([i for i, r in enumerate(BATCHES) if r() is not None]))\n"
        "train()\n"
    )
    report = run_script(script, select=["P108"])
    assert report.by_code("P108")[0].evidence["holder"] == "running"
    # Every batch is gone once the function dropped it, as without nndoctor.
    assert out.read_text() == "[]"
