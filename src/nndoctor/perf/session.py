"""A perf session: run the user's script for a warm-up plus a measured window, then measure changes.

``run_perf`` reuses ``nndoctor.runner.run_target``: the script runs unchanged, the engine
stops it cleanly after ``warmup + steps`` optimizer steps, and the recorder's window-end
callback runs the ``--try`` experiments while the user's objects are still alive (on
copies, with the instrumentation switched off). The result is a ``PerfResult``; the
findings are derived from it by ``perf/torch/diagnosis.py``.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nndoctor.engine import Session
from nndoctor.findings import Report
from nndoctor.perf.torch.recorder import LoopFacts, PerfConfig, PerfRecorder
from nndoctor.perf.torch.rerun_child import DATA_WAIT_ENV
from nndoctor.perf.timeline import Breakdown, summarize
from nndoctor.registry import enabled_checks
from nndoctor.runner import Target, run_target

# From this share of the step spent waiting for data on, the loop is input-bound: step changes
# are compared on the step without the wait (they cannot shorten it; a faster loader can).
INPUT_BOUND_SHARE = 0.5


@dataclass
class DeviceInfo:
    name: str = "cpu"
    cuda: bool = False
    capability: tuple[int, int] | None = None
    other_processes: list[dict[str, Any]] = field(default_factory=list)
    nvml: str = "not used"

    @property
    def tensor_cores(self) -> bool:
        return bool(self.capability and self.capability >= (7, 0))


@dataclass
class PerfResult:
    config: PerfConfig
    breakdown: Breakdown
    facts: LoopFacts
    device: DeviceInfo
    trials: dict[str, Any]
    steps_run: int
    framework: str = "torch"  # "tensorflow": the breakdown is input wait vs compute (perf/tf_*.py)
    tf_facts: Any = None

    def to_json(self) -> dict[str, Any]:
        facts = self.facts
        if self.framework == "tensorflow":
            from nndoctor.perf.tf.diagnosis import tf_json

            return tf_json(self)
        return {
            "window": {"warmup": self.config.warmup, "steps": self.config.steps, "measured": self.breakdown.steps},
            "breakdown": self.breakdown.to_json(),
            "device": {"name": self.device.name, "capability": self.device.capability,
                       "other_processes": self.device.other_processes, "nvml": self.device.nvml},
            "peak_memory_bytes": facts.peak_memory_bytes,
            "kernel_timeline": facts.kernel_timeline,
            "loader": facts.loader_config,
            "syncs": {"by_kind": facts.sync_kinds,
                      "by_location": {str(k): v for k, v in facts.sync_locations.items()}},
            "trials": self.trials,
            **({"ddp": facts.ddp, "communication": facts.communication,
                "backwards_per_step": facts.backwards_per_step} if facts.ddp else {}),
        }


def _silent(message: str) -> None:
    return None

@dataclass
class PerfRun:
    """The state of one ``nndoctor perf`` run, kept beside its session (not on it): the
    configuration, what ``--try`` re-runs and from which folder (the script may chdir), the
    recorder timing the window, and the trials' results."""

    config: PerfConfig
    target: Target | None = None
    cwd: str = field(default_factory=os.getcwd)
    announce: Callable[[str], None] = _silent
    recorder: PerfRecorder | None = None
    trials: dict[str, Any] = field(default_factory=dict)
    tf_recorder: Any = None  # perf/tf/instrument.py's TfStepRecorder, once the script imports TensorFlow
    # Under torchrun: this rank, and the store channel the ranks' re-runs and reports go through
    # (perf/torch/ddp_trials.py), or why there is none (a str); None on one process.
    rank: Any = None
    channel: Any = None


class PerfSession(Session):
    """A Session whose subscribers are the perf recorder and the run-scope P checks; the
    perf run's own state is ``self.perf``."""

    def __init__(self, run: PerfRun, *, select=(), ignore=(), command=None) -> None:
        self.perf = run  # before the recorder is built: it reads the configuration
        config = run.config
        # Every step of the window is a sampled step (CUDA events, sync locations).
        super().__init__(command=command, max_steps=config.last_step, checks=[],
                         full_window=config.last_step + 1)
        # The recorder first: the P checks read what it recorded of the same event.
        run.recorder = PerfRecorder(self)
        self.subscribe(run.recorder)
        for check in enabled_checks(select, ignore):
            if check.code.startswith("P"):
                self._add_check(check)
        run.recorder.on_window_end = self._window_end

    def count_step(self, optimizer: Any) -> None:
        super().count_step(optimizer)
        tf_recorder = self.perf.tf_recorder
        if tf_recorder is not None and tf_recorder.active:
            # Keras/TF steps arrive here only (no step events): the TF step clock closes a step.
            tf_recorder.step_counted(self.step)

    @property
    def perf_config(self) -> PerfConfig:
        """``perf/torch/recorder.py`` reads the configuration here."""
        return self.perf.config

    def _window_end(self, recorder: PerfRecorder) -> None:
        run = self.perf
        if not run.config.tries or tensorflow_run(run):
            return  # TensorFlow's trials run after the script (tf_trials.py)
        if isinstance(run.channel, str):  # under torchrun without the store: no re-run could rendezvous
            run.trials.update({name: {"skipped": f"under torchrun every rank re-runs the script together, which "
                                                 f"needs torchrun's store; this rank could not reach it ({run.channel})"}
                               for name in run.config.tries})
            return
        # The trials call optimizer.step() and the loss functions: keep every hook quiet.
        active, self.active = self.active, False
        run.announce(f"measured {run.config.steps} steps; now trying "
                     f"{', '.join(run.config.tries)} on the captured step and loader")
        job = None
        try:
            if run.channel is not None and not run.rank.is_leader:
                follow_trials(run)  # rank 0 decides what is re-run; this rank re-runs it too
                return
            if run.channel is not None:
                from nndoctor.perf.torch.ddp_trials import JobRerun
                from nndoctor.perf.rerun import CHILD_TIMEOUT_S

                config = run.config
                started = config.started if config.started is not None else time.monotonic()
                job = JobRerun(run.channel, _rank_child(run), CHILD_TIMEOUT_S,
                               time_left=lambda: config.budget - (time.monotonic() - started))
            # Filled in place: a trial interrupted by Ctrl-C / SIGTERM leaves the finished ones.
            run_trials(recorder, run.config, run.target, run.cwd, announce=run.announce, results=run.trials,
                       job=job)
        except Exception as error:  # noqa: BLE001 - observer rule
            self.internal_error("perf --try", error)
        finally:
            if job is not None:
                try:
                    job.done()  # the other ranks stop waiting for re-runs
                except Exception as error:  # noqa: BLE001
                    self.internal_error("perf --try (telling the other ranks the trials ended)", error)
            self.active = active


def _rank_child(run: PerfRun) -> Callable[..., dict[str, Any]]:
    """This rank's re-run of the script, as rank 0 commands it: the whole warm-up always runs (an
    early end on one rank would leave the others waiting in an all-reduce)."""
    from nndoctor.perf import rerun

    def run_child(changes: list[str], warmup: int, steps: int, min_steps: int | None,
                  env: dict[str, str], timeout_s: float | None = None) -> dict[str, Any]:
        return rerun.run_child(run.target, changes, warmup, steps, run.cwd, min_steps=min_steps, env=env,
                               timeout_s=timeout_s)

    return run_child


def follow_trials(run: PerfRun) -> None:
    from nndoctor.perf.torch.ddp_trials import follow
    from nndoctor.perf.rerun import CHILD_TIMEOUT_S

    started = run.config.started if run.config.started is not None else time.monotonic()
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # this rank's re-runs need the memory this process no longer uses
    follow(run.channel, _rank_child(run), started + run.config.budget + CHILD_TIMEOUT_S + 60.0)


def tensorflow_result(run: PerfRun, session: PerfSession) -> PerfResult:
    """A Keras/TensorFlow window: input wait vs compute per step, and the TF --try re-runs."""
    from nndoctor.perf.tf.diagnosis import tf_breakdown
    from nndoctor.perf.tf.trials import tensorflow_trials

    recorder = run.tf_recorder
    facts = recorder.facts
    return PerfResult(config=run.config, breakdown=tf_breakdown(recorder.records), facts=LoopFacts(),
                      device=DeviceInfo(name=facts.gpus[0] if facts.gpus else "cpu"),
                      trials=tensorflow_trials(run, session), steps_run=session.step, framework="tensorflow",
                      tf_facts=facts)


def tensorflow_run(run: PerfRun) -> bool:
    """Did the steps come from Keras/TensorFlow (no PyTorch optimizer step was timed)?"""
    tf_recorder = run.tf_recorder
    torch_steps = run.recorder is not None and (run.recorder.records or run.recorder.facts.steps_seen)
    return bool(tf_recorder is not None and tf_recorder.active and tf_recorder.steps_seen and not torch_steps)


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
    step = None if missing else step_trials.CapturedStep(model, optimizer, loss_fn, recorder.captured_inputs,
                                                    recorder.captured_target, device)
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

    return tuple(torch.cuda.get_device_capability(torch.cuda.current_device()))  # type: ignore[return-value]


def _median_step_seconds(recorder: PerfRecorder) -> float | None:
    walls = [record.wall for record in recorder.records if record.wall]
    return statistics.median(walls) if walls else None


def device_info(facts: LoopFacts) -> DeviceInfo:
    info = DeviceInfo()
    if facts.device != "cuda":
        return info
    import torch

    info.cuda = True
    index = torch.cuda.current_device()
    info.name = torch.cuda.get_device_name(index)
    info.capability = tuple(torch.cuda.get_device_capability(index))
    info.other_processes, info.nvml = gpu_processes(index)
    return info


def gpu_processes(index: int) -> tuple[list[dict[str, Any]], str]:
    """Other compute processes on our GPU, through NVML (nvidia-ml-py), if it is there."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            processes = [{"pid": p.pid, "used_memory_bytes": p.usedGpuMemory}
                         for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        finally:
            pynvml.nvmlShutdown()
    except Exception as error:  # noqa: BLE001 - NVML missing in the container, no permission…
        return [], f"NVML unavailable: {type(error).__name__}"
    return other_gpu_processes(processes, os.getpid()), "ok"


def other_gpu_processes(processes: list[dict[str, Any]], own_pid: int) -> list[dict[str, Any]]:
    """The processes that are not us. In a container NVML reports host PIDs, so when our
    PID is absent one process (ours: this run holds a CUDA context) is set aside."""
    others = [p for p in processes if p["pid"] != own_pid]
    if len(others) == len(processes) and others:
        others = sorted(others, key=lambda p: p.get("used_memory_bytes") or 0)[:-1]
    return others


def run_perf(target: Target, config: PerfConfig, *, select=(), ignore=(),
             announce: Callable[[str], None] | None = None, rank: Any = None,
             channel: Any = None) -> tuple[Report, PerfResult]:
    """Run ``target`` under a perf session; the report carries the run-scope P findings.

    ``announce`` receives a line for each thing being measured, as it starts. Under torchrun,
    ``rank`` (distributed/context.py's RankInfo) and ``channel`` (perf/torch/ddp_trials.py) make the
    trials re-runs of every rank, driven by rank 0."""
    if config.started is None:  # the budget counts from here: the script's own run included
        config = dataclasses.replace(config, started=time.monotonic())
    run = PerfRun(config, target=target, announce=announce or _silent, rank=rank, channel=channel)
    session = PerfSession(run, select=select, ignore=ignore, command=target.command)
    run.announce(f"running {' '.join(target.command)}: {config.warmup} warm-up optimizer steps, "
                 f"then timing {config.steps}")
    report = run_target(target, session)
    if tensorflow_run(run):
        return report, tensorflow_result(run, session)
    recorder = run.recorder
    breakdown = summarize(recorder.records)
    try:
        device = device_info(recorder.facts)
    except Exception as error:  # noqa: BLE001
        session.internal_error("perf device info", error)
        device = DeviceInfo()
    result = PerfResult(config=config, breakdown=breakdown, facts=recorder.facts, device=device,
                        trials=run.trials, steps_run=session.step)
    return report, result
