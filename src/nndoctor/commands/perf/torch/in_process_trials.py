"""``--try tf32`` and ``--try fused-optimizer`` on a loop that is not input-bound, timed in this
process instead of re-running the script (no torch import, model build or warm-up to pay per
change): each on copies of the model and optimizer stepping the captured batch, interleaved
with the user's step on copies built alike, the device drained around each timing
(``captured_trials.time_captured_changes``). The loss on the same batch is compared — after
the warm-up steps for the fused optimizer, whose first loss cannot differ.

The verdicts are trial results like the re-runs' (``measure: "captured batch"``); a change that
pays, or is neutral, joins the winners' together re-run (``schedule.together_set``), so the
combination the advice names is still measured end to end. When a copy cannot be made here
(no rebuildable step, under torchrun, too little GPU memory, the user's step does not replay)
the change is re-run as before and its result says why (``not_in_process``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nndoctor.commands.perf.torch import captured_trials
from nndoctor.commands.perf.torch.step_trials import CapturedStep

IN_PROCESS_CHANGES = ("tf32", "fused-optimizer")
# Each copy holds its weights, gradients and optimizer state (the user's state size once warm)
# and the step's activations: taken as twice the model and optimizer state.
COPY_FACTOR = 2.0


@dataclass
class InProcessOutcome:
    """``decided``: changes whose result is in ``results`` (measured, skipped or not measured
    for the budget); ``rerun``: change → why it is re-run instead; ``interrupted``: Ctrl-C."""

    decided: list[str] = field(default_factory=list)
    rerun: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False


def state_bytes(model: Any, optimizer: Any) -> int:
    """Bytes of the model's parameters and buffers and of the optimizer's state tensors."""
    import torch

    tensors = [*model.parameters(), *model.buffers()]
    tensors += [value for state in optimizer.state.values() for value in state.values()
                if isinstance(value, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_reason(step: CapturedStep, copies: int, free_bytes: int | None = None) -> str | None:
    """Why ``copies`` copies of the model and optimizer do not fit on the GPU (None: they fit,
    or the step is not on CUDA). ``free_bytes``: the free memory (default: the driver's free
    memory plus what PyTorch's allocator holds unused)."""
    if step.device != "cuda":
        return None
    if free_bytes is None:
        import torch

        free_bytes = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    size = state_bytes(step.model, step.optimizer)
    need = COPY_FACTOR * copies * size
    if free_bytes > need:
        return None
    return (f"{copies} copies of the model and optimizer need ~{need / 2**30:.2f} GiB ({COPY_FACTOR:g} × "
            f"{size / 2**30:.2f} GiB each), {free_bytes / 2**30:.2f} GiB free on the GPU")


def time_in_process(results: dict[str, Any], step: CapturedStep | None, names: list[str], *,
                    predictions: dict[str, Any], compute_s: float | None, budget: Any,
                    measure_alone: Callable[[str], str], announce: Callable[[str], None] | None = None,
                    no_step_reason: str | None = None, free_bytes: int | None = None) -> InProcessOutcome:
    """``names`` (of IN_PROCESS_CHANGES) timed on the captured step into ``results[name]`` and
    ``results["in_process"]``; what cannot be timed here is left to the re-runs, with why."""
    outcome = InProcessOutcome()
    if not names:
        return outcome
    if step is None:
        why = no_step_reason or "your training step could not be rebuilt in this process"
        outcome.rerun = {name: why for name in names}
        return outcome
    memory = memory_reason(step, len(names) + 1, free_bytes)
    if memory:
        outcome.rerun = {name: memory for name in names}
        return outcome
    cost = captured_trials.estimated_cost(names, compute_s, together=False)
    outcome.decided = list(names)
    if not budget.fits(cost):
        results.update({name: {"not_measured": "budget", "predicted": predictions.get(name),
                               "command": measure_alone(name),
                               "text": f"not measured (budget): about {cost:.0f} s needed on the captured batch, "
                                       f"{max(0.0, budget.left()):.0f} s left"}
                        for name in names})
        return outcome
    if announce:
        announce(f"timing {', '.join(names)} in this process on the captured batch (copies of your model and "
                 f"optimizer, interleaved with your step; ~{cost:.0f} s) instead of re-running the script")
    try:
        import torch

        with torch.enable_grad():
            timed = captured_trials.time_captured_changes(step, names, compute_s=compute_s, together=False)
    except KeyboardInterrupt:
        results.update({name: {"not_measured": "interrupted", "predicted": predictions.get(name),
                               "command": measure_alone(name)} for name in names})
        results["interrupted"] = "interrupted (Ctrl-C or SIGTERM)"
        outcome.interrupted = True
        return outcome
    except Exception as error:  # noqa: BLE001 - the re-runs still measure them
        timed = {"error": f"{type(error).__name__}: {error}", "changes": {}}
    if timed.get("error"):
        outcome.decided = []
        outcome.rerun = {name: f"your step did not replay on the captured batch ({timed['error']})" for name in names}
        return outcome
    measured = []
    for name in names:
        verdict = dict(timed["changes"].get(name) or {"error": "not timed"})
        if "speedup" in verdict:
            results[name] = {**verdict, "predicted": predictions.get(name)}
            measured.append(name)
            if announce:
                announce(f"  {name} in this process: {verdict['speedup']:.2f}× ({1000 * verdict['base_s']:.1f} → "
                         f"{1000 * verdict['variant_s']:.1f} ms/step, noise {verdict['noise']:.1%}, loss change "
                         f"{verdict['loss_change']:.2%}): {'pays off' if verdict['pays_off'] else 'no gain'}")
        elif name == "fused-optimizer":
            # The copy is the user's optimizer with fused=True: the injected re-run would fail alike.
            results[name] = {"skipped": f"{type(step.optimizer).__name__}(fused=True) does not step here: "
                                        f"{verdict['error']}", "predicted": predictions.get(name)}
        else:
            outcome.decided.remove(name)
            outcome.rerun[name] = f"its copy did not step ({verdict['error']})"
    if measured:
        results["in_process"] = {"measure": captured_trials.MEASURE, "changes": measured, "steps": timed["steps"],
                                 "repeats": timed["repeats"], "baseline_s": timed["baseline_s"]}
    return outcome
