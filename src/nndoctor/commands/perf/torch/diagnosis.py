"""Perf findings from a measured run: ``diagnose(result)`` turns a finished ``TorchPerfResult`` into
the perf-scope findings (and the measured P102), each with its evidence and the gain that can be
expected — an Amdahl bound from the measured fractions, or the speed-up ``--try`` measured;
``advice(result)`` ranks what to change.
"""

from __future__ import annotations

from typing import Any

from nndoctor.commands.perf.detection import (
    SYNC_WARNING_FRACTION,
    data_bound,
    fixed_shapes_without_benchmark,
    fp32_on_tensor_cores,
    frequent_syncs,
    low_gpu_busy,
    nchw_conv_on_gpu,
    sync_overlap_bound,
    trial_outcome,
)
from nndoctor.commands.perf.measured_checks import (
    CudnnBenchmarkOff,
    GpuShared,
    HostDeviceSync,
    InputPipelineBound,
    LowGpuUtilization,
    MemoryFormat,
    NoMixedPrecision,
)
from nndoctor.commands.perf.run_checks import LoaderConfig
from nndoctor.core.findings import Finding, Location, Severity
from nndoctor.core.registry import Check


def _measured_advice(cls: type[Check], trials: dict[str, Any], name: str, claim: str,
                     location: Location | None, evidence: dict[str, Any]) -> Finding | None:
    """Advice that --try can confirm: measured gain -> warning, no gain -> nothing, not tried -> info."""
    outcome = trial_outcome(trials, name)
    if outcome is None:
        tried = trials.get(name)
        if isinstance(tried, dict) and tried.get("not_measured"):
            from nndoctor.commands.perf.predict import prediction_text

            return cls.finding(f"{claim}; not measured ({tried['not_measured']}), "
                               f"{prediction_text(tried.get('predicted') or {})}; measure it alone: "
                               f"{tried.get('command') or 'nndoctor perf --try ' + name.replace('_', '-')}",
                               location=location, evidence={**evidence, "measured": False,
                                                            "predicted": tried.get("predicted")},
                               severity=Severity.INFO)
        if isinstance(tried, dict) and (tried.get("error") or tried.get("skipped")):
            # --try was given and could not measure: say why, never "pass --try".
            why = tried.get("error") or tried.get("skipped")
            return cls.finding(f"{claim}; --try {name.replace('_', '-')} could not measure it: {why}",
                               location=location, evidence={**evidence, "measured": False, "why": why},
                               severity=Severity.INFO)
        flag = name.replace("_", "-")
        return cls.finding(f"{claim}; not measured here — run nndoctor perf --try {flag} to time it",
                           location=location, evidence={**evidence, "measured": False}, severity=Severity.INFO)
    if not outcome.get("pays_off"):
        return None
    where = (" on the captured batch (compute only: the loop waits for data, which hides it end to end)"
             if outcome.get("measure") == "captured batch" else "")
    return cls.finding(
        f"{claim}; measured{where}: {outcome['speedup']:.2f}× faster steps ({1000 * outcome['base_s']:.1f} → "
        f"{1000 * outcome['variant_s']:.1f} ms, timing noise {outcome['noise']:.1%}), "
        f"{_loss_words(outcome)} changed {outcome['loss_change']:.2%}",
        location=location, evidence={**evidence, "measured": True, "speedup": round(outcome["speedup"], 3),
                                     "noise": round(outcome["noise"], 4),
                                     "loss_change": outcome["loss_change"]},
        severity=Severity.WARNING,
    )


def _loss_words(outcome: dict[str, Any]) -> str:
    if outcome.get("measure") == "re-run":
        return "the loss after the measured window"
    return "loss on the same batch"


def diagnose(result: Any) -> list[Finding]:
    """Every perf-scope finding (and the measured P102) for a finished ``TorchPerfResult``."""
    findings: list[Finding] = []
    b, facts, device, trials = result.breakdown, result.facts, result.device, result.trials
    if b.steps == 0:
        return findings
    ms = 1000 * b.median_step

    data = data_bound(b.phases["data"], b.wall)
    loader_trial = trials.get("loader") if isinstance(trials.get("loader"), dict) else None
    if data:
        message = (f"the loop waited for data during {data['data_wait_fraction']:.0%} of the step time "
                   f"({b.phases['data'] / b.steps * 1000:.1f} ms of a {ms:.1f} ms step): a loader that "
                   f"kept up would make steps up to {data['max_speedup']:.2f}× faster (Amdahl bound)")
        best = (loader_trial or {}).get("best")
        if loader_trial is not None and best and loader_trial.get("speedup"):
            message += (f"; measured: {_setting(best)} {_rate(loader_trial, best)}, "
                        f"{loader_trial['speedup']:.2f}× the current setting")
        findings.append(InputPipelineBound.finding(message, location=facts.loader_location,
                                                   evidence={**data, "loader": facts.loader_config}))

    if loader_trial and loader_trial.get("best") and (loader_trial.get("speedup") or 0) >= 1.2:
        best, current = loader_trial["best"], loader_trial["current"]
        findings.append(LoaderConfig.finding(
            f"DataLoader({_setting(facts.loader_config)}) {_rate(loader_trial, current)}; measured on this "
            f"machine, {_setting(best)} {_rate(loader_trial, best)} ({loader_trial['speedup']:.2f}×"
            + (", loading, copy to the device and training step timed together)"
               if loader_trial.get("measure") == "end-to-end" else ")"),
            location=facts.loader_location,
            evidence={"current": facts.loader_config, "best": best, "speedup": round(loader_trial["speedup"], 3)},
            fix=f"DataLoader(..., {_setting(best)}, persistent_workers=True)"
                + ("; copy batches with .to(device, non_blocking=True)" if best.get("pin_memory") else ""),
        ))

    sync_types_hit = facts.device == "cuda" or facts.sync_kinds
    if sync_types_hit and frequent_syncs(b.syncs_per_step) and facts.sync_kinds:
        places = sorted(facts.sync_locations.items(), key=lambda kv: -kv[1])
        where = ", ".join(f"{loc or '?'} ×{n}" for loc, n in places[:3])
        blocked = b.fraction("sync")
        overlap = sync_overlap_bound(b.phases, b.wall)
        findings.append(HostDeviceSync.finding(
            f"{b.syncs_per_step:.1f} host-device syncs per step ({where}); the host sat blocked in them "
            f"{blocked:.0%} of the step time — removing them lets it prepare the next step meanwhile, "
            f"up to {1 / max(1e-3, 1 - overlap):.2f}× (overlap bound)",
            location=places[0][0] if places else None,
            evidence={"syncs_per_step": round(b.syncs_per_step, 2), "kinds": dict(facts.sync_kinds),
                      "blocked_fraction": round(blocked, 4), "max_speedup": round(1 / max(1e-3, 1 - overlap), 2)},
            severity=Severity.WARNING if blocked >= SYNC_WARNING_FRACTION else Severity.INFO,
        ))

    if device.other_processes:
        total = sum(p.get("used_memory_bytes") or 0 for p in device.other_processes)
        findings.append(GpuShared.finding(
            f"{len(device.other_processes)} other process(es) use {device.name} "
            f"(pids {[p['pid'] for p in device.other_processes]}, {total / 2**30:.1f} GiB): "
            "they share its compute and memory",
            evidence={"processes": device.other_processes},
        ))

    if fp32_on_tensor_cores(facts.device, device.capability, facts.param_dtype, facts.autocast):
        found = _measured_advice(NoMixedPrecision, trials, "amp",
                                 f"float32 training without autocast on {device.name} "
                                 f"(compute capability {device.capability[0]}.{device.capability[1]}, tensor cores)",
                                 facts.forward_location, {"param_dtype": facts.param_dtype})
        findings += [found] if found else []

    if nchw_conv_on_gpu(facts.device, facts.has_conv, facts.input_channels_last):
        found = _measured_advice(MemoryFormat, trials, "channels_last",
                                 "convolutions on NCHW input on the GPU",
                                 facts.forward_location, {"input_shapes": sorted(facts.input_shapes)[:3]})
        findings += [found] if found else []

    busy = b.gpu_busy_fraction
    if low_gpu_busy(busy):
        findings.append(LowGpuUtilization.finding(
            f"the GPU was busy at most {busy:.0%} of the step time (CUDA events over {b.steps} steps): "
            f"keeping it fed would make steps up to {1 / max(busy, 1e-3):.1f}× faster; the breakdown shows "
            f"where the rest goes",
            location=facts.forward_location,
            evidence={"gpu_busy_fraction": round(busy, 4), "max_speedup": round(1 / max(busy, 1e-3), 2)},
        ))

    if fixed_shapes_without_benchmark(facts.device, facts.has_conv, facts.input_shapes, facts.cudnn_benchmark):
        found = _measured_advice(CudnnBenchmarkOff, trials, "cudnn-benchmark",
                                 f"one input shape {next(iter(facts.input_shapes))} for the whole window "
                                 "with torch.backends.cudnn.benchmark off",
                                 facts.forward_location, {})
        findings += [found] if found else []

    from nndoctor.checks.tf32 import tf32_findings  # P115, its own module

    findings += tf32_findings(result)
    # A measured torch.compile gain has no catalog code: it appears in advice(), not here.
    return findings


def _setting(config: dict[str, Any]) -> str:
    parts = [f"num_workers={config.get('num_workers')}"]
    if config.get("pin_memory"):
        parts.append("pin_memory=True")
    if config.get("num_workers") and config.get("prefetch_factor") not in (None, 2):
        parts.append(f"prefetch_factor={config.get('prefetch_factor')}")
    return ", ".join(parts)


def _rate(loader_trial: dict[str, Any], result: dict[str, Any]) -> str:
    """A --try loader rate, worded by how it was measured: the loader alone or end to end."""
    if loader_trial.get("measure") == "end-to-end":
        return f"trains at {result['samples_per_s']:.0f} samples/s end to end"
    return f"loads {result['samples_per_s']:.0f} samples/s"


def advice(result: Any) -> list[dict[str, Any]]:
    """The changes worth making, measured where --try ran (machine-readable, for scripts)."""
    items: list[dict[str, Any]] = []
    trials = result.trials
    loader_trial = trials.get("loader") if isinstance(trials.get("loader"), dict) else None
    if loader_trial and loader_trial.get("best") and (loader_trial.get("speedup") or 0) >= 1.2:
        best = loader_trial["best"]
        items.append({"change": "loader", "num_workers": best["num_workers"], "pin_memory": best["pin_memory"],
                      "prefetch_factor": best.get("prefetch_factor"), "persistent_workers": bool(best["num_workers"]),
                      "measured_speedup": loader_trial["speedup"]})
    b = result.breakdown
    if b.steps and result.facts.sync_kinds and frequent_syncs(b.syncs_per_step):
        items.append({"change": "fewer-syncs", "syncs_per_step": b.syncs_per_step,
                      "locations": [str(k) for k in result.facts.sync_locations]})
    best = trials.get("best")
    if isinstance(best, dict):
        items += best_point_advice(trials, best)
        return items + captured_step_advice(trials, items)
    for name in ("amp", "channels_last", "cudnn-benchmark", "compile", "tf32", "fused-optimizer", "sdpa",
                 "cuda-graphs", "ddp-bucket-view", "ddp-static-graph", "ddp-bucket-cap", "ddp-no-sync"):
        outcome = trial_outcome(trials, name)
        if outcome and outcome.get("pays_off") and outcome.get("measure") != "captured batch":
            items.append(_with_setting(name, outcome, {"change": name, "measured_speedup": outcome["speedup"],
                                                       "noise": outcome["noise"]}))
    batch = trial_outcome(trials, "batch-size")
    if batch and batch.get("pays_off"):
        items.append(batch_size_advice(batch))
    items += combined_advice(trials, {item["change"] for item in items})
    return items + captured_step_advice(trials, items)


def captured_step_advice(trials: dict[str, Any], advised: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An input-bound loop's step changes that won on compute (perf/torch/captured_trials.py):
    each with its speed-up on the captured batch and how it was confirmed — end to end at the
    loader's best setting (then, with the loader, a ``combination`` item with the measured
    samples/s), or not separable there ("gains once the input pipeline keeps up", measured on
    the step). Winners that measured slower end to end are not advised."""
    captured = trials.get("captured_step") or {}
    verdict, winners = captured.get("advice"), captured.get("winners") or []
    if not winners or verdict not in ("end to end", "step only"):
        return []
    names = {item["change"] for item in advised}
    end_to_end = captured.get("end_to_end") or {}
    together = captured.get("together") or {}
    step_speedup = together["speedup"] if len(winners) > 1 and together.get("speedup") else \
        captured["changes"][winners[0]]["speedup"]
    items: list[dict[str, Any]] = []
    for name in winners:
        if name in names:
            continue
        outcome = captured["changes"][name]
        item: dict[str, Any] = {"change": name, "measured_speedup": outcome["speedup"], "noise": outcome["noise"],
                                "measured_as": "on the captured batch (compute only, in this process)",
                                "loss_change": outcome["loss_change"]}
        if len(winners) > 1:
            item["measured_together_with"] = [n for n in winners if n != name]
        if verdict == "end to end":
            item["end_to_end_speedup"] = end_to_end["speedup"]
            item["end_to_end_at"] = dict(end_to_end["setting"])
        else:
            item["gains"] = ("once the input pipeline keeps up: measured on the step, not end to end ("
                             + _not_separated(end_to_end) + ")")
        items.append(item)
    loader = trials.get("loader") if isinstance(trials.get("loader"), dict) else {}
    current = (loader or {}).get("current") or {}
    if verdict == "end to end" and "combination" not in names and "loader" in names and current.get("samples_per_s"):
        items.append({"change": "combination", "changes": ["loader", *winners],
                      "measured_speedup": end_to_end["variant_samples_per_s"] / current["samples_per_s"],
                      "step_speedup": step_speedup,
                      "measured_as": (f"end to end: {' + '.join(winners)} at {_setting(end_to_end['setting'])} "
                                      f"{end_to_end['variant_samples_per_s']:.0f} samples/s against your loader "
                                      f"setting {current['samples_per_s']:.0f} samples/s (timed with the same step "
                                      "changes)")})
    return items


def _not_separated(end_to_end: dict[str, Any]) -> str:
    if end_to_end.get("speedup"):
        return (f"at {_setting(end_to_end['setting'])} the loader still bounds the loop: "
                f"{end_to_end['speedup']:.2f}× end to end, noise {end_to_end.get('noise', 0.0):.1%}")
    return str(end_to_end.get("not_measured") or end_to_end.get("error") or "not timed end to end")


def best_point_advice(trials: dict[str, Any], best: dict[str, Any]) -> list[dict[str, Any]]:
    """The best measured configuration (perf/schedule.py's ``best_point``): one item per change
    in it, then the combination with its measured ratio against the baseline. A change that paid
    alone but is not part of the best point is left out: applied with it, it was slower."""
    items: list[dict[str, Any]] = []
    for name in best["changes"]:
        if name.startswith("batch-size="):
            batch = trial_outcome(trials, "batch-size")
            if batch and batch.get("best"):
                items.append(batch_size_advice(batch))
            continue
        outcome = trials.get(name) or {}
        item: dict[str, Any] = _with_setting(name, outcome, {"change": name, "measured_speedup": outcome.get("speedup"),
                                                             "noise": outcome.get("noise")})
        if not outcome.get("pays_off"):
            item["measured_with"] = [n for n in best["changes"] if n != name]
        if outcome.get("measure") == "captured batch":  # a compute-bound loop's in-process timing
            item["measured_as"] = "on the captured batch (copies in this process, interleaved with your step)"
        items.append(item)
    if len(best["changes"]) > 1:
        items.append({"change": "combination", "changes": list(best["changes"]),
                      "measured_speedup": best["speedup"], "measured_as": best["measured_as"]})
    return items


def _with_setting(name: str, outcome: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """``ddp-bucket-cap``'s advice names the cap that was measured."""
    cap = (outcome.get("predicted") or {}).get("bucket_cap_mb")
    if name == "ddp-bucket-cap" and cap is not None:
        item["bucket_cap_mb"] = cap
    return item


def combined_advice(trials: dict[str, Any], advised: set[str]) -> list[dict[str, Any]]:
    """Changes that did not pay alone but paid on top of the paying ones (perf/combine.py)."""
    best = (trials.get("combined") or {}).get("best_added") or {}
    return [{"change": name, "measured_speedup": best["speedup"], "noise": best["noise"],
             "unit": best.get("unit", "samples/s"),
             "measured_with": best["over"], "measured_together_with": best["added"]}
            for name in best.get("added", []) if name not in advised]


def batch_size_advice(outcome: dict[str, Any]) -> dict[str, Any]:
    """The measured larger batch, with what it means for the learning rate: nndoctor times
    throughput, it does not check that training converges as well at that batch."""
    best, base = outcome["best"], outcome["sizes"][0]
    factor = best["factor"]
    return {
        "change": "batch-size", "batch_size": best["batch_size"], "from": base["batch_size"], "factor": factor,
        "measured_speedup": outcome["speedup"], "noise": outcome["noise"], "unit": "samples/s",
        "samples_per_s": best["samples_per_s"], "peak_memory_bytes": best.get("peak_memory_bytes"),
        "learning_rate": (
            f"a {factor}× larger batch is a different optimisation, not only a faster one: with SGD scale the "
            f"learning rate by {factor} and warm it up over the first epochs (linear scaling rule, Goyal et al. "
            f"2017, https://arxiv.org/abs/1706.02677); with Adam/AdamW start from √{factor} (square-root rule, "
            f"Malladi et al. 2022, https://arxiv.org/abs/2205.10287); keep the number of epochs, not of steps, "
            "and compare validation curves — nndoctor measured speed, not convergence"),
    }
