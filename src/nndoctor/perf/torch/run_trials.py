"""The PyTorch ``--try`` trials of a perf run, run at the end of the measured window while the
user's objects are alive: the step changes as re-runs of the script (``perf/rerun.py``, scheduled
within the budget by ``perf/schedule.py``), then the DataLoader settings on the captured loader.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

from nndoctor.perf.config import PerfConfig
from nndoctor.perf.timeline import summarize
from nndoctor.perf.torch.recorder import PerfRecorder
from nndoctor.perf.torch.rerun_child import DATA_WAIT_ENV
from nndoctor.runner import Target

# From this share of the step spent waiting for data on, the loop is input-bound: step changes
# are compared on the step without the wait (they cannot shorten it; a faster loader can).
INPUT_BOUND_SHARE = 0.5


def run_trials(recorder: PerfRecorder, config: PerfConfig, target: Target, cwd: str,
               announce: Callable[[str], None] | None = None,
               results: dict[str, Any] | None = None, job: Any = None) -> dict[str, Any]:
    """The --try trials, into ``results`` (in place) and returned. ``job``: under torchrun, rank 0's
    re-run of every rank (perf/torch/ddp_trials.py's JobRerun)."""
    import torch

    from nndoctor.perf import predict, rerun, schedule, trials
    from nndoctor.perf.torch import loader_trials, step_trials

    results = {} if results is None else results
    results.update({
        name: {"skipped": f"--try {name} is a Keras/TensorFlow change and this script trains with PyTorch; "
                          f"{trials.TF_EQUIVALENTS[name]}"}
        for name in config.tries if name in trials.TF_TRIALS and not config.try_all})
    facts = recorder.facts
    cuda = facts.device == "cuda"
    device = facts.device if cuda else "cpu"
    model = recorder.model_ref() if recorder.model_ref else None
    optimizer = recorder.optimizer_ref() if recorder.optimizer_ref else None
    loss_fn = step_trials.loss_callable(recorder)
    missing = [name for name, value in (("model", model), ("optimizer", optimizer), ("loss", loss_fn),
                                        ("batch", recorder.captured_inputs)) if value is None]
    if recorder.captured_target is None:
        missing.append("target")
    step = None if missing or loss_fn is None else step_trials.CapturedStep(
        model, optimizer, loss_fn, recorder.captured_inputs, recorder.captured_target, device)
    ddp = getattr(facts, "ddp", None)
    # Under --try all a script without DDP is not told about DDP's settings; asked by name, it is.
    step_tries = tuple(t for t in config.tries if t in trials.STEP_TRIALS
                       and not (t in trials.DDP_TRIALS and config.try_all and not ddp))
    if job is not None and "loader" in config.tries:
        config = dataclasses.replace(config, tries=tuple(t for t in config.tries if t != "loader"))
        results["loader"] = {"skipped": "not under torchrun: the loader trial steps a copy of the model in this "
                                        "process, outside the process group; measure it on one process "
                                        "(nndoctor perf --try loader SCRIPT)"}
    budget = schedule.Budget(config.budget, config.started if config.started is not None else time.monotonic())
    predictions: dict[str, Any] = {}
    if step_tries or "loader" in config.tries:
        facts_for_plan = predict.plan_facts(summarize(recorder.records), facts, _capability(cuda))
        order, predictions = predict.plan(step_tries + (("loader",) if "loader" in config.tries else ()),
                                          facts_for_plan)
        order = [name for name in order if name != "loader"]
        if announce:
            for name, prediction in predictions.items():
                announce(f"--try {name}: {predict.prediction_text(prediction)}")
    else:
        order = []
    if step_tries:
        # The user's own loop, re-run with each change injected: any step shape works.
        if announce:
            announce(f"re-running the script with {', '.join(order) or 'nothing'} injected, most promising "
                     f"first, against the baseline; budget {config.budget:g} s, {max(0.0, budget.left()):.0f} s left")
        if cuda:
            torch.cuda.empty_cache()  # the re-runs need the memory this process no longer uses
        steps = rerun.window_steps(config.steps, _median_step_seconds(recorder))
        warmup = max(config.warmup, rerun.MIN_COMPILED_WARMUP) if any(
            n in rerun.COMPILED for n in order) else config.warmup
        cache = schedule.CompileCache()
        child_env = dict(cache.env)
        data_share = (facts_for_plan.fractions or {}).get("data", 0.0)
        if data_share >= INPUT_BOUND_SHARE:
            child_env[DATA_WAIT_ENV] = "1"
            results["step_timing"] = {"excludes_data_wait": True, "data_share": round(data_share, 3)}
            if announce:
                announce(f"the loop waited for data {data_share:.0%} of the step: the step changes are timed "
                         "without that wait (the loader trial measures loading)")

        cap = (predictions.get("ddp-bucket-cap") or {}).get("bucket_cap_mb")

        def run_child(changes: list[str]) -> dict[str, Any]:
            env = dict(child_env)
            if cap is not None:
                from nndoctor.perf.torch.ddp_trials import BUCKET_CAP_ENV

                env[BUCKET_CAP_ENV] = str(cap)
            if job is not None:
                return job.run(changes, warmup, steps, config.steps, env)
            # The warm-up ends early once two steps take the same time (compiled changes: after 3 at least).
            least = rerun.MIN_COMPILED_WARMUP if any(c in rerun.COMPILED for c in changes) else rerun.MIN_STABLE_WARMUP
            return rerun.run_child(target, changes, warmup, steps, cwd, min_steps=config.steps, env=env,
                                   min_warmup=least)

        measure_alone = schedule.measure_alone_command(target)
        if job is not None:
            world = job.channel.info.world_size
            single = measure_alone
            measure_alone = lambda name: f"torchrun --nproc_per_node {world} -m {single(name)}"  # noqa: E731
        step_budget = budget
        loader_first = _loader_reserve(config, predictions, order, cuda, facts)
        if loader_first:
            # The loader is timed after the step changes (it is confirmed against the faster step),
            # but when it promises more than any of them its time is kept out of their budget.
            step_budget = schedule.Budget(max(0.0, config.budget - loader_first), budget.started)
            if announce:
                announce(f"--try loader promises the most: {loader_first:.0f} s of the budget kept for it")
        scheduler = schedule.TrialScheduler(run_child, budget=step_budget, repeats=config.try_repeats, device=device,
                                            announce=announce, measure_alone=measure_alone,
                                            first_estimate=budget.elapsed(),
                                            noise_floor=_window_noise(recorder))
        cuda_only = {name: {"skipped": f"{why}; this run trained on {device}"}
                     for name, why in rerun.CUDA_ONLY.items() if name in order and device != "cuda"}
        results.update(cuda_only)
        try:
            scheduler.run_all([n for n in order if n not in cuda_only],
                              {n: p for n, p in predictions.items() if n in step_tries and n not in cuda_only},
                              results)
        finally:
            cache.close()
        results["baseline"] = {"times_s": scheduler.baseline.times(), "measure": "re-run",
                               "repeats": config.try_repeats, "runs": len(scheduler.baseline.runs),
                               "warmup": warmup, "steps": steps, "re_runs": scheduler.runs_done,
                               "loss": rerun._median([r.get("final_loss") for r in scheduler.baseline.ok_runs()])}
        best = schedule.best_point(results)
        if best:
            results["best"] = best
        results["budget"] = {"seconds": config.budget, "used_s": round(budget.elapsed(), 1),
                             "longest_re_run_s": max((r.get("wall_s", 0.0) for r in scheduler.all_runs), default=0.0)}
        if scheduler.interrupted:
            return results
    if "loader" in config.tries and config.try_all and "skip" in predictions.get("loader", {}):
        # Under --try all a loader that cannot matter is not timed; asked for by name, it is.
        results["loader"] = {"skipped": predictions["loader"]["skip"], "predicted": predictions["loader"]}
    if "loader" in config.tries and "loader" not in results:
        loader_cost = _loader_cost(config, cuda, facts.loader_config)
        if not budget.fits(loader_cost):
            results["loader"] = {"not_measured": "budget", "predicted": predictions.get("loader"),
                                 "command": schedule.measure_alone_command(target)("loader"),
                                 "text": f"not measured (budget): about {loader_cost:.0f} s needed, "
                                         f"{max(0.0, budget.left()):.0f} s left; "
                                         + predict.prediction_text(predictions.get("loader") or {})}
            return results
    if "loader" in config.tries and "loader" not in results:
        # The loader is confirmed against the step as it will be once the step changes that
        # paid off are applied (a faster step needs more loading): hence after the step trials.
        paid = [name for name in ("amp", "channels_last") if (results.get(name) or {}).get("pays_off")]
        variant = "+".join(paid) or "baseline"
        loader = recorder.loader_ref() if recorder.loader_ref else None
        if loader is None:
            results["loader"] = {"skipped": "no DataLoader was iterated in the measured window"}
        else:
            if announce:
                announce(f"timing DataLoader settings (about {config.try_seconds:g} s each)")
            try:
                with torch.enable_grad():
                    results["loader"] = loader_trials.try_loader(loader, facts.loader_config, cuda=cuda,
                                                          seconds=config.try_seconds, step=step,
                                                          step_variant=variant)
                results["loader"]["step_variant"] = variant
                if missing:
                    results["loader"]["confirm_skipped"] = (f"no end-to-end timing: could not rebuild the step "
                                                            f"(no {', '.join(missing)} seen)")
            except KeyboardInterrupt:
                results["loader"] = {"not_measured": "interrupted", "predicted": predictions.get("loader")}
                results["interrupted"] = "interrupted (Ctrl-C or SIGTERM)"
            except Exception as error:  # noqa: BLE001
                results["loader"] = {"error": f"{type(error).__name__}: {error}"}
            else:
                _confirm_hidden_step_gains(results, loader, step, config, budget, announce)
    return results


def _confirm_hidden_step_gains(results: dict[str, Any], loader: Any, step: Any, config: Any, budget: Any,
                               announce: Callable[[str], None] | None) -> None:
    """An input-bound loop hides a faster step: its re-runs wait for data whatever the step
    costs, so AMP or channels_last measure "no gain" against the noise of the wait. Once the
    loader's best setting is known, the step changes that measured faster there (undecided,
    loss unchanged) are timed end to end at that setting against the user's step; when they pay
    there, they join the advice as measured that way."""
    from nndoctor.perf.torch import loader_trials

    if not (results.get("step_timing") or {}).get("excludes_data_wait") or step is None:
        return
    best = (results.get("loader") or {}).get("best")
    if not best or not best.get("num_workers"):
        return
    parts = [name for name in loader_trials.END_TO_END_CHANGES
             if (results.get(name) or {}).get("speedup", 0.0) > 1.0 and (results.get(name) or {}).get("loss_ok", True)]
    if not parts or not budget.fits(8 * config.try_seconds):
        return
    variant = "+".join(parts)
    if announce:
        announce(f"timing {variant} end to end at num_workers={best['num_workers']}: the data wait hid its gain")
    try:
        import torch

        with torch.enable_grad():
            outcome = loader_trials.confirm_step_variant(loader, best, step, variant, seconds=config.try_seconds)
    except Exception as error:  # noqa: BLE001 - the loader advice stands; say why there is no more
        outcome = {"variant": variant, "error": f"{type(error).__name__}: {error}"}
    results["loader"]["step_variant_end_to_end"] = outcome
    if outcome.get("pays_off") and not results.get("best"):
        results["best"] = {"changes": parts, "speedup": outcome["speedup"],
                           "measured_as": f"end to end at the loader's best setting (num_workers="
                                          f"{best['num_workers']}, pin_memory={best['pin_memory']}), against "
                                          "your step there"}


def _loader_cost(config: Any, cuda: bool, loader_config: Any) -> float:
    from nndoctor.perf.torch import loader_trials

    grid = loader_trials.loader_grid(loader_trials.available_cpus(), cuda, loader_config)
    return (len(grid) + 3) * config.try_seconds * 1.5


def _loader_reserve(config: Any, predictions: dict[str, Any], order: list[str], cuda: bool, facts: Any) -> float:
    """Seconds to keep for the loader trial: its estimated cost when it is asked for and its
    predicted gain is above every step change's; else 0."""
    loader = predictions.get("loader") or {}
    if "loader" not in config.tries or "skip" in loader or loader.get("bound") is None:
        return 0.0
    best_step = max(((predictions.get(name) or {}).get("bound") or 0.0 for name in order), default=0.0)
    if loader["bound"] <= best_step:
        return 0.0
    return _loader_cost(config, cuda, facts.loader_config)


def _window_noise(recorder: PerfRecorder) -> float:
    """The spread of the script's own step times over its window, scaled to a window mean
    (/ √steps): how far two re-runs' medians may differ by chance, before any was repeated."""
    from nndoctor.perf.timeline import relative_noise

    walls = [record.wall for record in recorder.records if record.wall]
    return relative_noise(walls) / len(walls) ** 0.5 if len(walls) >= 2 else 0.0


def _capability(cuda: bool) -> tuple[int, int] | None:
    if not cuda:
        return None
    import torch

    major, minor = torch.cuda.get_device_capability(torch.cuda.current_device())
    return major, minor


def _median_step_seconds(recorder: PerfRecorder) -> float | None:
    walls = [record.wall for record in recorder.records if record.wall]
    return statistics.median(walls) if walls else None
