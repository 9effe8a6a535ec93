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

from nndoctor.commands.perf.config import PerfConfig
from nndoctor.commands.perf.timeline import summarize
from nndoctor.commands.perf.torch.recorder import PerfRecorder
from nndoctor.commands.perf.torch.rerun_child import DATA_WAIT_ENV
from nndoctor.run.runner import Target

# From this share of the step spent waiting for data on, the loop is input-bound: step changes
# are compared on the step without the wait (they cannot shorten it; a faster loader can).
INPUT_BOUND_SHARE = 0.5


def run_trials(recorder: PerfRecorder, config: PerfConfig, target: Target, cwd: str,
               announce: Callable[[str], None] | None = None,
               results: dict[str, Any] | None = None, job: Any = None) -> dict[str, Any]:
    """The --try trials, into ``results`` (in place) and returned. ``job``: under torchrun, rank 0's
    re-run of every rank (perf/torch/ddp_trials.py's JobRerun)."""
    import torch

    from nndoctor.commands.perf import predict, rerun, schedule, trials
    from nndoctor.commands.perf.torch import (
        captured_trials,
        in_process_trials,
        loader_trials,
        step_trials,
    )

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
    data_share = ((facts_for_plan.fractions or {}).get("data", 0.0)
                  if step_tries or "loader" in config.tries else 0.0)
    captured_names = [name for name in order if name in captured_trials.CAPTURED_CHANGES
                      and not (name in rerun.CUDA_ONLY and device != "cuda")]
    on_captured = data_share >= INPUT_BOUND_SHARE and step is not None and job is None and bool(captured_names)
    if on_captured:
        # The re-runs would time these at ~1.0× behind the data wait: judged on compute instead.
        order = [name for name in order if name not in captured_names]
        if not _captured_step_trials(results, step, captured_names, predictions, recorder, data_share, budget,
                                     schedule.measure_alone_command(target), announce):
            return results  # interrupted
        if not order:
            results.update({name: {"skipped": predictions[name]["skip"], "predicted": predictions[name]}
                            for name in step_tries if "skip" in predictions.get(name, {})})
            _merge_captured(results)
    in_process = in_process_trials.InProcessOutcome()
    first_estimate = budget.elapsed()  # one re-run's work: the script up to the end of its window
    if data_share < INPUT_BOUND_SHARE and step_tries:
        # TF32 and the fused optimizer on copies in this process: no re-run to pay for each.
        in_process = in_process_trials.time_in_process(
            results, step if job is None else None,
            [name for name in order if name in in_process_trials.IN_PROCESS_CHANGES], predictions=predictions,
            compute_s=_median_compute_seconds(recorder), budget=budget,
            measure_alone=schedule.measure_alone_command(target), announce=announce,
            no_step_reason=("under torchrun every rank re-runs the script (a copy in this process would step "
                            "outside the process group)" if job is not None else
                            f"could not rebuild your step in this process (no {', '.join(missing)} seen)"))
        if in_process.interrupted:
            return results
        order = [name for name in order if name not in in_process.decided]
    together_left = bool(in_process.decided) and len(schedule.together_set(results)) >= 2
    if step_tries and (order or together_left or not (on_captured or in_process.decided)):
        # The user's own loop, re-run with each change injected: any step shape works.
        if announce:
            what = ", ".join(order) or ("only the set of " + " + ".join(schedule.together_set(results))
                                        if together_left else "nothing")
            announce(f"re-running the script with {what} injected, most promising "
                     f"first, against the baseline; budget {config.budget:g} s, {max(0.0, budget.left()):.0f} s left")
        if cuda:
            torch.cuda.empty_cache()  # the re-runs need the memory this process no longer uses
        steps = rerun.window_steps(config.steps, _median_step_seconds(recorder))
        warmup = max(config.warmup, rerun.MIN_COMPILED_WARMUP) if any(
            n in rerun.COMPILED for n in order) else config.warmup
        cache = schedule.CompileCache()
        child_env = dict(cache.env)
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
                from nndoctor.commands.perf.torch.ddp_trials import BUCKET_CAP_ENV

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
        if loader_first and (results.get("captured_step") or {}).get("winners"):
            # and the winners' end-to-end timing at the loader's best setting, which follows it
            loader_first += captured_trials.confirm_cost(config.try_seconds)
        if loader_first:
            # The loader is timed after the step changes (it is confirmed against the faster step),
            # but when it promises more than any of them its time is kept out of their budget.
            step_budget = schedule.Budget(max(0.0, config.budget - loader_first), budget.started)
            if announce:
                announce(f"--try loader promises the most: {loader_first:.0f} s of the budget kept for it")
        scheduler = schedule.TrialScheduler(run_child, budget=step_budget, repeats=config.try_repeats, device=device,
                                            announce=announce, measure_alone=measure_alone,
                                            first_estimate=first_estimate,
                                            noise_floor=_window_noise(recorder))
        cuda_only = {name: {"skipped": f"{why}; this run trained on {device}"}
                     for name, why in rerun.CUDA_ONLY.items() if name in order and device != "cuda"}
        results.update(cuda_only)
        try:
            scheduler.run_all([n for n in order if n not in cuda_only],
                              {n: p for n, p in predictions.items()
                               if n in step_tries and n not in cuda_only and n not in in_process.decided},
                              results)
        finally:
            cache.close()
        for name, why in in_process.rerun.items():
            if isinstance(results.get(name), dict):
                results[name]["not_in_process"] = why
        results["baseline"] = {"times_s": scheduler.baseline.times(), "measure": "re-run",
                               "repeats": config.try_repeats, "runs": len(scheduler.baseline.runs),
                               "warmup": warmup, "steps": steps, "re_runs": scheduler.runs_done,
                               "loss": rerun._median([r.get("final_loss") for r in scheduler.baseline.ok_runs()])}
        best = schedule.best_point(results)
        if best:
            results["best"] = best
        _merge_captured(results)  # after best_point: compute-only verdicts are not re-run points
        results["budget"] = {"seconds": config.budget, "used_s": round(budget.elapsed(), 1),
                             "longest_re_run_s": max((r.get("wall_s", 0.0) for r in scheduler.all_runs), default=0.0)}
        if scheduler.interrupted:
            return results
    elif in_process.decided:
        # Every step change was decided in this process: no re-run at all.
        results.update({name: {"skipped": predictions[name]["skip"], "predicted": predictions[name]}
                        for name in step_tries if "skip" in predictions.get(name, {})})
        best = schedule.best_point(results)
        if best:
            results["best"] = best
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
    if "loader" in config.tries and "loader" not in results:
        # The loader is confirmed against the step as it will be once the step changes that
        # paid off are applied (a faster step needs more loading): hence after the step trials.
        captured = results.get("captured_step") or {}
        if captured.get("changes"):
            variant = "+".join(captured.get("winners") or []) or "baseline"
        else:
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
    captured = results.get("captured_step") or {}
    if captured.get("winners") and step is not None and not results.get("interrupted"):
        # Faster on compute: do they show end to end once the loader keeps up?
        loader = recorder.loader_ref() if recorder.loader_ref else None
        loader_result = results.get("loader") if isinstance(results.get("loader"), dict) else None
        try:
            captured_trials.confirm_winners(captured, loader, loader_result, step, seconds=config.try_seconds,
                                            budget=budget, announce=announce)
        except KeyboardInterrupt:
            captured["end_to_end"] = {"not_measured": "interrupted"}
            captured["advice"] = captured_trials.decide(captured, None)
            results["interrupted"] = "interrupted (Ctrl-C or SIGTERM)"
    if captured.get("changes") is not None or in_process.decided:
        results.setdefault("budget", {"seconds": config.budget, "longest_re_run_s": 0.0})
        results["budget"]["used_s"] = round(budget.elapsed(), 1)
    return results


def _captured_step_trials(results: dict[str, Any], step: Any, names: list[str], predictions: dict[str, Any],
                          recorder: PerfRecorder, data_share: float, budget: Any,
                          measure_alone: Callable[[str], str], announce: Callable[[str], None] | None) -> bool:
    """``names`` timed on the captured batch (perf/torch/captured_trials.py) into
    ``results["captured_step"]``; merged into ``results[name]`` later (``_merge_captured``).
    False when interrupted (Ctrl-C / SIGTERM): the report keeps what finished."""
    from nndoctor.commands.perf.torch import captured_trials

    compute_s = _median_compute_seconds(recorder)
    cost = captured_trials.estimated_cost(names, compute_s)
    results["step_timing"] = {"excludes_data_wait": True, "data_share": round(data_share, 3)}
    if not budget.fits(cost):
        results.update({name: {"not_measured": "budget", "predicted": predictions.get(name),
                               "command": measure_alone(name),
                               "text": f"not measured (budget): about {cost:.0f} s needed on the captured batch"}
                        for name in names})
        return True
    if announce:
        announce(f"the loop waited for data {data_share:.0%} of the step: timing {', '.join(names)} on the "
                 f"captured batch (compute only, in this process, interleaved with your step; ~{cost:.0f} s)")
    try:
        captured = captured_trials.time_captured_changes(step, names, compute_s=compute_s)
    except KeyboardInterrupt:
        results.update({name: {"not_measured": "interrupted", "predicted": predictions.get(name),
                               "command": measure_alone(name)} for name in names})
        results["interrupted"] = "interrupted (Ctrl-C or SIGTERM)"
        return False
    except Exception as error:  # noqa: BLE001 - report why, the other trials still run
        captured = {"measure": captured_trials.MEASURE, "error": f"{type(error).__name__}: {error}", "changes": {}}
    for name in names:
        verdict = captured["changes"].get(name) or {"error": captured.get("error") or "not timed"}
        verdict["predicted"] = predictions.get(name)
        captured["changes"][name] = verdict
        if announce and "speedup" in verdict:
            announce(f"  {name} on the captured batch: {verdict['speedup']:.2f}× ({1000 * verdict['base_s']:.1f} → "
                     f"{1000 * verdict['variant_s']:.1f} ms/step, noise {verdict['noise']:.1%}, loss change "
                     f"{verdict['loss_change']:.2%}): {'faster' if verdict['pays_off'] else 'no gain'}")
    together = captured.get("together") or {}
    if announce and together.get("speedup"):
        announce(f"  {' + '.join(together['changes'])} together on the captured batch: {together['speedup']:.2f}×")
    results["captured_step"] = captured
    return True


def _merge_captured(results: dict[str, Any]) -> None:
    """The compute verdicts as the changes' results (P105/P106 and the report read them there);
    kept out of the re-runs' together-set and best point, which compare re-runs only."""
    for name, verdict in ((results.get("captured_step") or {}).get("changes") or {}).items():
        results[name] = verdict


def _loader_cost(config: Any, cuda: bool, loader_config: Any) -> float:
    from nndoctor.commands.perf.torch import loader_trials

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
    from nndoctor.commands.perf.timeline import relative_noise

    walls = [record.wall for record in recorder.records if record.wall]
    return relative_noise(walls) / len(walls) ** 0.5 if len(walls) >= 2 else 0.0


def _capability(cuda: bool) -> tuple[int, int] | None:
    if not cuda:
        return None
    import torch

    major, minor = torch.cuda.get_device_capability(torch.cuda.current_device())
    return major, minor


def _median_compute_seconds(recorder: PerfRecorder) -> float | None:
    """The step without its data wait, over the window (what the captured-batch timing repeats)."""
    rest = [record.wall - (record.phases or {}).get("data", 0.0) for record in recorder.records if record.wall]
    return statistics.median(rest) if rest else None


def _median_step_seconds(recorder: PerfRecorder) -> float | None:
    walls = [record.wall for record in recorder.records if record.wall]
    return statistics.median(walls) if walls else None
