"""Step changes judged on compute when the loop is input-bound.

A loop that waits for data hides a faster step: re-runs of the script measure AMP or
channels_last at ~1.0× whatever they save on the GPU (the kernels run while the host waits for
the next batch). So on an input-bound loop the changes the captured step can apply
(``CAPTURED_CHANGES``) are timed in this process on the batch captured at the end of the window
— copies of the model and optimizer, the user's loss, the device drained around every timing —
interleaved with the user's step; the winners are then timed end to end at the loader's best
setting (``loader_trials.confirm_step_variant``), and ``decide`` says how they are advised:
with the loader when they measure faster there, as gains "once the input pipeline keeps up"
(measured on the step, not end to end) when the loader still bounds the loop, not at all when
they measure slower end to end.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from nndoctor.commands.perf.timeline import speedup_verdict
from nndoctor.commands.perf.torch.step_trials import CapturedStep, StepRunner

# Changes StepRunner applies to a copy of the step (and time_end_to_end can feed with a loader).
CAPTURED_CHANGES = ("amp", "channels_last", "cudnn-benchmark", "tf32")
MEASURE = "captured batch"
REPEATS = 5
WARMUP = 3
# Each timing covers about this long (at least MIN_STEPS, at most MAX_STEPS steps).
TIMING_S = 0.25
MIN_STEPS, MAX_STEPS = 2, 10
GAIN_FLOOR = 0.03
# Changes to the optimizer's update: the first loss (before any step) cannot differ, so their
# loss is compared after the warm-up steps, each copy stepped from the same weights on the batch.
OPTIMIZER_CHANGES = ("fused-optimizer",)


def steps_per_timing(compute_s: float | None) -> int:
    if not compute_s or compute_s <= 0:
        return MIN_STEPS
    return max(MIN_STEPS, min(MAX_STEPS, math.ceil(TIMING_S / compute_s)))


def estimated_cost(names: list[str], compute_s: float | None, together: bool = True) -> float:
    """Seconds for the baseline, each change and (``together``) their combination: warm-up and
    the timed rounds, 1.5× for first-call costs (autotuning, autocast caches)."""
    steps = steps_per_timing(compute_s)
    per_variant = (WARMUP + REPEATS * steps) * (compute_s or 0.05)
    return 1.5 * (len(names) + (2 if together else 1)) * per_variant


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _time_steps(runner: StepRunner, steps: int) -> float:
    """Seconds per step over ``steps`` steps, the device drained before and after."""
    _sync(runner.device)
    started = time.perf_counter()
    for _ in range(steps):
        runner.step()
    _sync(runner.device)
    return (time.perf_counter() - started) / steps


def time_captured_changes(step: CapturedStep, names: list[str], *, compute_s: float | None = None,
                          repeats: int = REPEATS, warmup: int = WARMUP, together: bool = True) -> dict[str, Any]:
    """Each change of ``names`` (and, when several win and ``together``, the winners together)
    timed on the captured batch, interleaved with the user's step; loss on the same batch
    compared (after the warm-up steps for ``OPTIMIZER_CHANGES``).

    Returns ``{"measure", "steps", "repeats", "baseline_s", "changes": {name: verdict},
    "together": verdict | None, "winners": [...]}``; a verdict has ``speedup``, ``noise``,
    ``pays_off`` (faster beyond the noise, loss within ``rerun.LOSS_TOLERANCE``), ``loss_change``.
    Copies only, the RNG streams forked: the user's objects and generators are as they were."""
    import torch

    from nndoctor.commands.perf.rerun import LOSS_TOLERANCE

    steps = steps_per_timing(compute_s)
    out: dict[str, Any] = {"measure": MEASURE, "steps": steps, "repeats": repeats, "changes": {},
                           "together": None, "winners": []}
    devices = [torch.cuda.current_device()] if step.device == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        runners, losses = _build(step, ["baseline", *names], warmup, out["changes"])
        if "baseline" not in runners:
            out["error"] = out["changes"].pop("baseline")["error"]
            return out
        times = _interleaved(runners, repeats, steps)
        out["baseline_s"] = statistics.median(times["baseline"])
        for name in names:
            if name in runners:
                out["changes"][name] = _verdict(times["baseline"], times[name], *_compared_losses(name, losses),
                                                LOSS_TOLERANCE.get(name, 0.01), repeats)
        winners = [n for n in names if (out["changes"].get(n) or {}).get("pays_off")]
        for name in list(runners):
            if name != "baseline":
                del runners[name]
        if together and len(winners) >= 2:
            variant = "+".join(winners)
            extra, extra_losses = _build(step, [variant], warmup, {})
            if variant in extra:
                runners[variant] = extra[variant]
                together_times = _interleaved(runners, repeats, steps)
                tolerance = max(LOSS_TOLERANCE.get(n, 0.01) for n in winners)
                out["together"] = {"changes": winners, **_verdict(together_times["baseline"], together_times[variant],
                                                                  *_compared_losses(variant, {**losses, **extra_losses}),
                                                                  tolerance, repeats)}
        best_single = max(winners, key=lambda n: out["changes"][n]["speedup"], default=None)
        combined = out["together"] or {}
        if combined.get("pays_off") and best_single and combined["speedup"] >= out["changes"][best_single]["speedup"]:
            out["winners"] = list(winners)
        elif best_single:
            out["winners"] = [best_single]
        del runners
    if step.device == "cuda":
        torch.cuda.empty_cache()  # the copies' memory, for the re-runs and the loader trial
    return out


def _build(step: CapturedStep, variants: list[str], warmup: int,
           errors: dict[str, Any]) -> tuple[dict[str, StepRunner], dict[str, Any]]:
    """A runner per variant, its losses on the captured batch (same seed for each) before and
    after its warm-up steps (``{name: (before, after, steps)}``); a variant that cannot be built
    or stepped gets ``{"error"}`` in ``errors``."""
    import torch

    runners: dict[str, StepRunner] = {}
    losses: dict[str, Any] = {}
    for name in variants:
        try:
            runner = StepRunner(name, step.model, step.optimizer, step.loss_fn, step.inputs, step.target, step.device)
            torch.manual_seed(0)
            with torch.no_grad():
                before = float(runner.loss().float())
            for _ in range(warmup):
                runner.step()
            torch.manual_seed(0)
            with torch.no_grad():
                losses[name] = (before, float(runner.loss().float()), warmup)
            runners[name] = runner
        except Exception as error:  # noqa: BLE001 - this variant is reported, the others still run
            errors[name] = {"error": f"{type(error).__name__}: {error}", "measure": MEASURE}
    return runners, losses


def _compared_losses(variant: str, losses: dict[str, Any]) -> tuple[float, float, int]:
    """The baseline's and the variant's loss to compare, and after how many steps: before any
    step, or after the warm-up when the variant changes the optimizer's update."""
    after = bool(set(variant.split("+")) & set(OPTIMIZER_CHANGES))
    base, mine = losses["baseline"], losses[variant]
    return (base[1], mine[1], mine[2]) if after else (base[0], mine[0], 0)


def _interleaved(runners: dict[str, StepRunner], repeats: int, steps: int) -> dict[str, list[float]]:
    """Rounds over every runner, the order reversed every other round (a warming or drifting
    machine hits each alike)."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners.items())
    for round_ in range(repeats):
        for name, runner in (order if round_ % 2 == 0 else order[::-1]):
            times[name].append(_time_steps(runner, steps))
    return times


def _verdict(base: list[float], variant: list[float], base_loss: float, loss: float, loss_after_steps: int,
             tolerance: float, repeats: int) -> dict[str, Any]:
    verdict = speedup_verdict(base, variant, floor=GAIN_FLOOR)
    change = abs(loss - base_loss) / max(abs(base_loss), 1e-12)
    loss_ok = math.isfinite(loss) and change <= tolerance
    verdict.update({"measure": MEASURE, "runs": repeats, "loss_baseline": base_loss, "loss_variant": loss,
                    "loss_change": change, "loss_ok": loss_ok, "pays_off": bool(verdict["pays_off"] and loss_ok),
                    "times_s": variant})
    if loss_after_steps:
        verdict["loss_after_steps"] = loss_after_steps
    return verdict


def decide(captured: dict[str, Any], end_to_end: dict[str, Any] | None) -> str | None:
    """How the compute winners are advised, from their end-to-end timing at the loader's best
    setting: "end to end" (faster there, beyond its noise), "slower end to end" (slower beyond
    the noise: not advised), "step only" (within the noise, or not timed end to end: the loader
    still bounds the loop; advised as gains once the input pipeline keeps up). None: no winner."""
    if not captured.get("winners"):
        return None
    if not end_to_end or not end_to_end.get("speedup"):
        return "step only"
    if end_to_end.get("pays_off"):
        return "end to end"
    if end_to_end["speedup"] < 1.0 - max(end_to_end.get("noise") or 0.0, GAIN_FLOOR):
        return "slower end to end"
    return "step only"


def confirm_cost(seconds: float, rounds: int = 3) -> float:
    """Seconds for ``confirm_step_variant``: two steps × ``rounds`` timings, each up to one
    epoch of ``TimingWindow.EPOCH_STRETCH`` × ``seconds`` plus the workers' start-up."""
    return 2 * rounds * (2 * seconds + 1.0)


def confirm_winners(captured: dict[str, Any], loader: Any, loader_result: dict[str, Any] | None, step: CapturedStep,
                    *, seconds: float, budget: Any, announce: Any = None) -> None:
    """Times the winners end to end at the loader's best setting (when there is one and it
    fits the budget) and records the outcome and ``advice`` in ``captured`` (in place)."""
    from nndoctor.commands.perf.torch import loader_trials

    winners = captured.get("winners") or []
    if not winners:
        return
    best = (loader_result or {}).get("best")
    outcome: dict[str, Any]
    if loader is None or not best or not best.get("num_workers"):
        outcome = {"not_measured": "no better loader setting was measured to time them at"}
    elif not budget.fits(confirm_cost(seconds)):
        outcome = {"not_measured": f"budget: about {confirm_cost(seconds):.0f} s needed, "
                                   f"{max(0.0, budget.left()):.0f} s left"}
    else:
        variant = "+".join(winners)
        if announce:
            announce(f"timing {variant} end to end at num_workers={best['num_workers']}, pin_memory="
                     f"{best['pin_memory']} against your step: faster on the captured batch")
        try:
            import torch

            with torch.enable_grad():
                outcome = loader_trials.confirm_step_variant(loader, best, step, variant, seconds=seconds)
        except KeyboardInterrupt:
            raise
        except Exception as error:  # noqa: BLE001 - the step verdicts stand; say why there is no more
            outcome = {"variant": variant, "error": f"{type(error).__name__}: {error}"}
    captured["end_to_end"] = outcome
    captured["advice"] = decide(captured, outcome)
