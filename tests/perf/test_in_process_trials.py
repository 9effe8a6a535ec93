"""Issue 29, cheap re-runs: on a loop that is not input-bound, ``--try fused-optimizer`` (and
``tf32`` on CUDA) is timed in this process on copies stepping the captured batch instead of
re-running the script; a change that pays joins the winners' together re-run, and when no copy
can be made here the change is re-run and says why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from nndoctor.commands.perf import rerun, schedule
from nndoctor.commands.perf.render import trial_lines
from nndoctor.commands.perf.torch import captured_trials, in_process_trials
from nndoctor.commands.perf.torch.step_trials import CapturedStep

SCRIPTS = Path(__file__).parent / "scripts"


class FakeReRuns:
    """Stands in for re-running the script (a subprocess each): known step times per set of
    changes, and the list of the sets that were re-run."""

    def __init__(self, monkeypatch, times: dict[str, float]) -> None:
        self.times, self.calls = times, []
        monkeypatch.setattr(rerun, "run_child", self)

    def __call__(self, target, changes, *args, **kwargs) -> dict:
        self.calls.append(list(changes))
        return {"seconds_per_step": self.times[",".join(sorted(changes))], "final_loss": 1.0,
                "applied": list(changes) or ["baseline"], "samples_per_step": 8}


def scripted_step_times(monkeypatch, seconds: dict[str, float]) -> list[float]:
    """The copies still step the captured batch (losses compared, memory used), but each timing
    reports ``seconds[variant]``: the decisions that follow the measurement are what these tests
    check, and a real speedup measured on a loaded 2-core machine is noise (the fused copy's
    ~2× measured 0.92× once under ``pytest -n 3``). Returns the real seconds, to show they ran."""
    real_time_steps, measured = captured_trials._time_steps, []

    def time_steps(runner, steps):
        measured.append(real_time_steps(runner, steps))
        return seconds[runner.variant]

    monkeypatch.setattr(captured_trials, "_time_steps", time_steps)
    return measured


def _perf(script: str, tries: tuple[str, ...]):
    from nndoctor.commands.perf.config import PerfConfig
    from nndoctor.commands.perf.session import run_perf
    from nndoctor.run.runner import Target

    lines: list[str] = []
    _, result = run_perf(Target(str(SCRIPTS / script), []),
                         PerfConfig(warmup=2, steps=6, tries=tries, budget=120.0), announce=lines.append)
    return result, lines


@pytest.mark.slow
def test_the_fused_optimizer_is_timed_in_process_and_joins_the_together_re_run(monkeypatch):
    """Adam's per-parameter loop over 242 small tensors is about half of this CPU step: the fused
    copy is ~2× faster on the captured batch. Only amp and the set are re-run."""
    from nndoctor.commands.perf.torch.diagnosis import advice

    fake = FakeReRuns(monkeypatch, {"": 0.020, "amp": 0.015, "amp,fused-optimizer": 0.010})
    measured = scripted_step_times(monkeypatch, {"baseline": 0.020, "fused-optimizer": 0.010})
    result, lines = _perf("many_params_adam.py", ("fused-optimizer", "amp"))
    trials = result.trials
    # No re-run of the script for fused-optimizer alone: the baseline, amp, then the set (the
    # first two repeated, interleaved, when the machine's noise leaves amp's verdict open).
    assert fake.calls[0] == [] and fake.calls[-1] == ["amp", "fused-optimizer"]
    assert {tuple(changes) for changes in fake.calls} == {(), ("amp",), ("amp", "fused-optimizer")}
    fused = trials["fused-optimizer"]
    assert fused["measure"] == "captured batch" and fused["runs"] == captured_trials.REPEATS
    assert fused["speedup"] == pytest.approx(2.0), fused
    assert len(measured) == 2 * captured_trials.REPEATS and all(t > 0 for t in measured)
    # The loss compared on the same batch after the warm-up steps (before any, it cannot differ).
    assert fused["loss_after_steps"] == captured_trials.WARMUP and fused["loss_baseline"] > 0
    assert fused["loss_ok"] and fused["loss_change"] < 1e-3
    assert trials["in_process"]["changes"] == ["fused-optimizer"]
    assert trials["combined"]["changes"] == ["amp", "fused-optimizer"] and trials["combined"]["measure"] == "re-run"
    assert trials["best"]["changes"] == ["amp", "fused-optimizer"]
    items = {item["change"]: item for item in advice(result)}
    assert items["fused-optimizer"]["measured_as"].startswith("on the captured batch")
    assert items["combination"]["changes"] == ["amp", "fused-optimizer"]
    assert items["combination"]["measured_as"] == "together, interleaved with the baseline"
    text = "\n".join(trial_lines(trials))
    assert "--try fused-optimizer in this process, not re-run" in text
    assert "loss change after 3 steps on the same batch" in text
    assert any("timing fused-optimizer in this process" in line for line in lines)
    assert trials["budget"]["used_s"] <= 120.0
    json.dumps(result.to_json())  # the JSON report carries it


@pytest.mark.slow
def test_a_change_decided_in_process_alone_needs_no_re_run_at_all(monkeypatch):
    fake = FakeReRuns(monkeypatch, {})
    scripted_step_times(monkeypatch, {"baseline": 0.020, "fused-optimizer": 0.010})
    result, _ = _perf("many_params_adam.py", ("fused-optimizer",))
    trials = result.trials
    assert fake.calls == [] and "baseline" not in trials
    assert trials["fused-optimizer"]["measure"] == "captured batch" and trials["fused-optimizer"]["speedup"] > 1.3
    assert trials["fused-optimizer"]["pays_off"]
    assert trials["best"]["changes"] == ["fused-optimizer"]
    assert trials["best"]["measured_as"].startswith("alone, on the captured batch in this process")
    assert trials["budget"]["used_s"] <= 120.0


def test_a_step_that_does_not_replay_is_re_run_and_says_why(monkeypatch):
    """A dict batch passed as keyword arguments, the loss computed inside the model: the captured
    step cannot be replayed on copies, so fused-optimizer is re-run as before, and says why."""
    fake = FakeReRuns(monkeypatch, {"": 0.020, "fused-optimizer": 0.019})
    result, _ = _perf("dict_batch_own_loss.py", ("fused-optimizer",))
    trials = result.trials
    assert ["fused-optimizer"] in fake.calls and "in_process" not in trials
    fused = trials["fused-optimizer"]
    assert fused["measure"] == "re-run"
    assert fused["not_in_process"].startswith("your step did not replay on the captured batch (TypeError: ")
    assert "  re-run, not timed in this process: your step did not replay" in "\n".join(trial_lines(trials))


# -- the decision, on its own ----------------------------------------------------------------------
def _step(device: str = "cpu", optimizer_options: dict | None = None) -> CapturedStep:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))  # 66 820 float32 parameters
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, **(optimizer_options or {}))
    return CapturedStep(model, optimizer, nn.CrossEntropyLoss(), (torch.randn(4, 256),), torch.tensor([0, 1, 2, 3]),
                        device)


def _time(results: dict, step: CapturedStep | None, free_bytes: int | None = None, seconds: float = 60.0, **kwargs):
    return in_process_trials.time_in_process(
        results, step, ["fused-optimizer"], predictions={"fused-optimizer": {"kind": "prediction", "bound": 1.5}},
        compute_s=0.002, budget=schedule.Budget(seconds), measure_alone=lambda name: f"nndoctor perf --try {name} t.py",
        free_bytes=free_bytes, **kwargs)


def test_copies_that_do_not_fit_on_the_gpu_leave_the_change_to_the_re_run():
    step = _step(device="cuda")  # the memory check runs before anything touches a device
    size = in_process_trials.state_bytes(step.model, step.optimizer)
    assert size == 66_820 * 4
    results: dict = {}
    outcome = _time(results, step, free_bytes=3 * size)  # 2 copies × 2 × size are needed
    assert outcome.decided == [] and results == {}
    why = outcome.rerun["fused-optimizer"]
    assert why.startswith("2 copies of the model and optimizer need ~0.00 GiB") and "free on the GPU" in why
    assert in_process_trials.memory_reason(step, 2, free_bytes=5 * size) is None
    assert in_process_trials.memory_reason(_step(), 2, free_bytes=0) is None  # CPU memory is not guarded


def test_an_optimizer_without_fused_kernels_for_its_gradients_is_skipped_with_the_reason(monkeypatch):
    """Sparse embedding gradients (word2vec-style): plain SGD steps them, fused SGD cannot."""
    monkeypatch.setattr(captured_trials, "TIMING_S", 0.01)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(100, 8, sparse=True), nn.Flatten(), nn.Linear(16, 4))
    step = CapturedStep(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                        (torch.randint(0, 100, (4, 2)),), torch.tensor([0, 1, 2, 3]), "cpu")
    results: dict = {}
    outcome = _time(results, step)
    assert outcome.decided == ["fused-optimizer"] and not outcome.rerun  # a re-run would fail alike
    assert results["fused-optimizer"]["skipped"] == ("SGD(fused=True) does not step here: RuntimeError: "
                                                     "`_fused_sgd` does not support sparse gradients")
    assert "in_process" not in results
    assert "--try fused-optimizer: SGD(fused=True) does not step here" in "\n".join(trial_lines(results))


def test_no_rebuildable_step_and_a_budget_too_small(monkeypatch):
    results: dict = {}
    outcome = _time(results, None, no_step_reason="could not rebuild your step in this process (no loss seen)")
    assert outcome.rerun == {"fused-optimizer": "could not rebuild your step in this process (no loss seen)"}
    outcome = _time(results, _step(), seconds=0.0)
    assert outcome.decided == ["fused-optimizer"] and results["fused-optimizer"]["not_measured"] == "budget"
    assert results["fused-optimizer"]["command"] == "nndoctor perf --try fused-optimizer t.py"


def test_the_users_objects_are_left_as_they_were(monkeypatch):
    monkeypatch.setattr(captured_trials, "TIMING_S", 0.01)
    step = _step(optimizer_options={"momentum": 0.9})
    weights = [p.detach().clone() for p in step.model.parameters()]
    rng = torch.get_rng_state()
    results: dict = {}
    outcome = _time(results, step)
    assert outcome.decided == ["fused-optimizer"] and results["fused-optimizer"]["measure"] == "captured batch"
    assert all(torch.equal(a, b) for a, b in zip(weights, step.model.parameters()))
    assert not step.optimizer.state and step.optimizer.defaults.get("fused") is None
    assert torch.equal(rng, torch.get_rng_state())


def test_an_adamw_copy_is_adamw_with_the_users_settings():
    """torch's AdamW keeps Adam's ``decoupled_weight_decay`` in its defaults but its constructor
    refuses it: the copies (the baseline's and the fused one) must still be AdamW, not a stand-in."""
    from nndoctor.commands.perf.torch.step_trials import StepRunner

    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05, foreach=False)
    batch, target = torch.randn(2, 4), torch.tensor([0, 1])
    for variant, fused in (("baseline", None), ("fused-optimizer", True)):
        copy = StepRunner(variant, model, optimizer, nn.CrossEntropyLoss(), (batch,), target, "cpu").optimizer
        assert type(copy) is torch.optim.AdamW and copy.defaults["fused"] is fused
        assert copy.defaults["lr"] == 3e-4 and copy.defaults["weight_decay"] == 0.05


def test_a_change_timed_in_process_is_advised_through_the_set_it_joined_when_one_was_re_run():
    """Its ratio on copies (compute only) is not comparable with a re-run's: when the set it
    joined was re-run, the best point is chosen among re-run points."""
    fused = {"speedup": 2.2, "noise": 0.1, "pays_off": True, "loss_ok": True, "measure": "captured batch"}
    amp = {"speedup": 1.3, "noise": 0.02, "pays_off": True, "loss_ok": True, "measure": "re-run"}
    combined = {"changes": ["amp", "fused-optimizer"], "speedup": 2.0, "pays_off": True}
    best = schedule.best_point({"fused-optimizer": fused, "amp": amp, "combined": combined})
    assert best == {"changes": ["amp", "fused-optimizer"], "speedup": 2.0,
                    "measured_as": "together, interleaved with the baseline"}
    # No set re-run: the in-process verdict is the measurement there is, and says how it was made.
    best = schedule.best_point({"fused-optimizer": fused})
    assert best is not None and best["changes"] == ["fused-optimizer"]
    assert best["measured_as"].startswith("alone, on the captured batch in this process")


def test_changes_all_decided_in_process_are_still_re_run_together():
    """`--try tf32,fused-optimizer` on a compute-bound GPU loop: both timed in process, nothing
    left to re-run alone, but the set the advice would name is re-run against the baseline."""
    calls: list[list[str]] = []

    def run(changes: list[str]) -> dict:
        calls.append(list(changes))
        return {"seconds_per_step": {"": 0.020, "fused-optimizer,tf32": 0.011}[",".join(sorted(changes))],
                "final_loss": 1.0, "applied": list(changes) or ["baseline"]}

    verdict = {"noise": 0.02, "pays_off": True, "loss_ok": True, "loss_change": 0.001, "measure": "captured batch"}
    results = {"tf32": {**verdict, "speedup": 1.4}, "fused-optimizer": {**verdict, "speedup": 1.3}}
    schedule.TrialScheduler(run, budget=schedule.Budget(1000.0), repeats=3, device="cuda").run_all([], {}, results)
    assert calls[0] == [] and calls[-1] == ["tf32", "fused-optimizer"] and ["tf32"] not in calls
    assert results["combined"]["changes"] == ["tf32", "fused-optimizer"]
    assert results["combined"]["speedup"] == pytest.approx(20 / 11)
    assert schedule.best_point(results)["changes"] == ["tf32", "fused-optimizer"]


def test_the_copies_keep_the_users_parameter_groups():
    """nanoGPT-style groups: weight decay on the matrices only, and a lower learning rate for the
    head; the baseline's copy and the fused one both keep them (the fused one in every group)."""
    from nndoctor.commands.perf.torch.step_trials import StepRunner

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    decay = [model[0].weight]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": [model[0].bias], "weight_decay": 0.0},
                                   {"params": list(model[2].parameters()), "lr": 1e-4}], lr=1e-3)
    batch, target = torch.randn(2, 4), torch.tensor([0, 1])
    for variant in ("baseline", "fused-optimizer"):
        runner = StepRunner(variant, model, optimizer, nn.CrossEntropyLoss(), (batch,), target, "cpu")
        groups = runner.optimizer.param_groups
        assert [g["weight_decay"] for g in groups] == [0.1, 0.0, 0.01] and [g["lr"] for g in groups] == [1e-3, 1e-3, 1e-4]
        assert groups[0]["params"][0] is runner.model[0].weight and groups[2]["params"][1] is runner.model[2].bias
        assert all(g["fused"] is (True if variant == "fused-optimizer" else None) for g in groups)
        runner.step()  # the copy steps; the user's parameters are not its own
        assert groups[0]["params"][0] is not model[0].weight
