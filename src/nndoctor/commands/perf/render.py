"""Text rendering of the step-time breakdown and the --try measurements (no torch here)."""

from __future__ import annotations

from typing import Any

from nndoctor.commands.perf.timeline import PHASE_LABELS

TF_TRIAL_NAMES = ("prefetch", "parallel-map", "mixed-precision")
DDP_TRIAL_NAMES = ("ddp-bucket-view", "ddp-static-graph", "ddp-bucket-cap", "ddp-no-sync")
TF_PHASE_LABELS = {"data": "input wait (tf.data iterator)", "compute": "compute (rest of the step)"}


def _bar(fraction: float, width: int = 30) -> str:
    filled = int(round(max(0.0, min(1.0, fraction)) * width))
    return "█" * filled + "·" * (width - filled)


def breakdown_lines(perf: dict[str, Any]) -> list[str]:
    """The breakdown (from ``PerfResult.to_json()``) as lines of plain text."""
    b = perf["breakdown"]
    window = perf["window"]
    lines = []
    if not b["steps"]:
        lines.append(f"no step measured: the script ran fewer than {window['warmup'] + 2} optimizer steps "
                     f"(warm-up {window['warmup']}); lower --warmup or let it run longer")
        return lines
    labels = {**PHASE_LABELS, **TF_PHASE_LABELS} if perf.get("framework") == "tensorflow" else PHASE_LABELS
    rate = f", {b['samples_per_s']:.1f} samples/s" if b.get("samples_per_s") else ""
    lines.append(f"step time over {b['steps']} measured steps (after {window['warmup']} warm-up): "
                 f"median {1000 * b['median_step_s']:.1f} ms{rate}")
    for name, seconds in b["phases_s"].items():
        fraction = b["fractions"][name]
        per_step = 1000 * seconds / b["steps"]
        lines.append(f"  {labels.get(name, name):<30} {per_step:9.2f} ms  {fraction:6.1%}  {_bar(fraction)}")
    device = perf["device"]
    if perf.get("step_class"):
        lines.append(f"step class: {perf['step_class']['class']} — {perf['step_class']['reason']}")
    busy = b.get("gpu_busy_fraction")
    if busy is not None:
        lines.append(f"GPU ({device['name']}): busy at most {busy:.0%} of the step (CUDA events)")
    kernel = perf.get("kernel_timeline") or {}
    if kernel.get("busy_fraction") is not None:
        lines.append(f"kernel timeline ({kernel['steps']} warm-up steps, torch.profiler): kernels run "
                     f"{kernel['busy_fraction']:.0%} of the step; GPU idle while the host launches/works "
                     f"{kernel['host_idle_fraction']:.0%}, while it waits for data {kernel['data_idle_fraction']:.0%}")
    elif kernel.get("error"):
        lines.append(f"kernel timeline: not measured ({kernel['error']})")
    if perf.get("ddp"):
        from nndoctor.commands.perf.torch.ddp_comm import comm_lines

        lines += comm_lines(perf)
    if perf.get("peak_memory_bytes"):
        lines.append(f"peak GPU memory allocated: {perf['peak_memory_bytes'] / 2**30:.2f} GiB")
    if perf.get("framework") == "tensorflow":
        return lines + tf_input_lines(perf)
    lines.append(f"host-device syncs: {b['syncs_per_step']:.1f} per step"
                 + (f" ({', '.join(f'{k} {v}' for k, v in perf['syncs']['by_location'].items())})"
                    if perf["syncs"]["by_location"] else ""))
    if device.get("name") != "cpu":
        others = device.get("other_processes") or []
        lines.append(f"other processes on the GPU: {len(others)}" + ("" if device.get("nvml") == "ok"
                                                                      else f" ({device.get('nvml')})"))
    return lines


def tf_input_lines(perf: dict[str, Any]) -> list[str]:
    """Keras/TensorFlow: where the input was iterated, the median wait, the dtype policy."""
    facts = perf.get("input") or {}
    where = f" (iterated at {facts['iterated_at']})" if facts.get("iterated_at") else ""
    backend = f"Keras {facts['keras_backend']} backend, " if facts.get("keras_backend") else ""
    lines = [f"median input wait {1000 * (facts.get('median_wait_s') or 0):.2f} ms a step{where}; "
             f"{backend}dtype policy {facts.get('dtype_policy') or '?'}; device {perf['device']['name']}"]
    if (facts.get("steps_per_execution") or 1) > 1:
        lines.append(f"steps_per_execution={facts['steps_per_execution']}: the batches are fetched inside the "
                     "compiled function, so the input wait is inside 'compute' and cannot be told apart")
    return lines


def trial_lines(trials: dict[str, Any]) -> list[str]:
    lines = []
    loader = trials.get("loader")
    if isinstance(loader, dict):
        if loader.get("results"):
            lines.append("--try loader (steady-state samples/s, copied to the GPU when training on CUDA; startup = time to the first batch):")
            for r in loader["results"]:
                rate = f"{r['samples_per_s']:.1f}" if r.get("samples_per_s") else "-"
                mark = "  ← best" if loader.get("best") is r or loader.get("best") == r else ""
                lines.append(f"  num_workers={r['num_workers']:<3} pin_memory={str(r['pin_memory']):<5} "
                             f"prefetch={str(r.get('prefetch_factor')):<4} {rate:>10} samples/s  "
                             f"startup {r.get('startup_s') or 0:.2f} s{mark}")
            if loader.get("confirmed"):
                variant = loader.get("step_variant") or "baseline"
                step = "as you run it" if variant == "baseline" else f"with {variant.replace('+', ' + ')}"
                lines.append(f"  end to end (loading, copy to the device, training step on a copy of the model, "
                             f"{step}):")
                for r in loader["confirmed"]:
                    rate = f"{r['samples_per_s']:.1f}" if r.get("samples_per_s") else "-"
                    mark = "  ← best" if loader.get("best") is r or loader.get("best") == r else ""
                    lines.append(f"  num_workers={r['num_workers']:<3} pin_memory={str(r['pin_memory']):<5} "
                                 f"prefetch={str(r.get('prefetch_factor')):<4} {rate:>10} samples/s  "
                                 f"{r.get('steps', 0)} steps{mark}")
            for key in ("confirm_error", "confirm_skipped"):
                if loader.get(key):
                    lines.append(f"  {loader[key]}")
        elif loader.get("not_measured"):
            lines.append(f"--try loader: {loader.get('text') or 'not measured (' + loader['not_measured'] + ')'}")
            if loader.get("command"):
                lines.append(f"  measure it alone: {loader['command']}")
        else:
            lines.append(f"--try loader: {loader.get('skipped') or loader.get('error')}")
    lines += captured_lines(trials.get("captured_step"))
    baseline = trials.get("baseline") or {}
    if baseline.get("measure") == "re-run":
        done = f" ({baseline['re_runs']} re-runs in all)" if baseline.get("re_runs") is not None else ""
        lines.append(f"--try step changes: your script re-run {baseline['repeats']}× per change at most, fewer once "
                     f"the verdict is clear, interleaved with the baseline, each change injected "
                     f"({baseline['warmup']} warm-up + {baseline['steps']} measured steps a run){done}:")
        timing = trials.get("step_timing") or {}
        if timing.get("excludes_data_wait"):
            lines.append(f"  (the loop waited for data {timing['data_share']:.0%} of the step: each change is timed on "
                         "the step without that wait, which only the loader settings shorten)")
    in_process = trials.get("in_process") or {}
    if in_process.get("changes"):
        lines.append(f"--try {', '.join(in_process['changes'])} in this process, not re-run: copies of your model and "
                     f"optimizer stepping your captured batch, {in_process['repeats']} interleaved rounds of "
                     f"{in_process['steps']} steps against your step on copies alike:")
        lines += [in_process_line(name, trials[name]) for name in in_process["changes"]
                  if isinstance(trials.get(name), dict) and "speedup" in trials[name]]
    for name in ("amp", "channels_last", "compile", "cudnn-benchmark", "tf32", "fused-optimizer", "sdpa",
                 "cuda-graphs", "batch-size", *DDP_TRIAL_NAMES, *TF_TRIAL_NAMES):
        result = trials.get(name)
        if not isinstance(result, dict):
            continue
        if name == "batch-size" and result.get("sizes"):
            lines += batch_size_lines(result)
            continue
        if result.get("not_measured"):
            lines += not_measured_lines(name, result) + _not_in_process(result)
            continue
        if result.get("measure") == "captured batch":
            continue  # in captured_lines, or above (in this process)
        if "speedup" not in result:
            lines.append(f"--try {name}: {result.get('skipped') or result.get('error')}")
            lines += _not_in_process(result)
            continue
        verdict = "pays off" if result["pays_off"] else ("changes the loss" if not result["loss_ok"] else "no gain")
        loss = f"{result['loss_change']:.2%}" if result.get("loss_change") is not None else "not read"
        runs = f", {result['runs']} run(s)" if result.get("runs") else ""
        lines.append(f"--try {name:<15} {result['speedup']:.2f}× ({1000 * result['base_s']:.1f} → "
                     f"{1000 * result['variant_s']:.1f} ms/step, noise {result['noise']:.1%}{runs}, "
                     f"loss change {loss}): {verdict} — measured{_predicted_suffix(result)}")
        lines += [f"  applied: {text}" for text in result.get("applied") or []
                  if name in TF_TRIAL_NAMES or name in DDP_TRIAL_NAMES]
        lines += _not_in_process(result)
        if result.get("rank_seconds_per_step"):
            lines.append("  slowest rank's step counted; per rank: "
                         + ", ".join(f"{1000 * t:.1f} ms" for t in result["rank_seconds_per_step"]))
    lines += combined_lines(trials.get("combined"))
    best = trials.get("best")
    if isinstance(best, dict):
        lines.append(f"best measured point: {' + '.join(best['changes'])} — {best['speedup']:.2f}× the baseline "
                     f"(measured {best['measured_as']}); the advice applies exactly these")
    budget = trials.get("budget")
    if isinstance(budget, dict):
        lines.append(f"budget: {budget['used_s']:.0f} s of {budget['seconds']:g} s used (--budget)")
    if trials.get("interrupted"):
        lines.append(f"--try {trials['interrupted']}: the trials above finished; the rest were not measured")
    return lines


def captured_lines(captured: dict[str, Any] | None) -> list[str]:
    """The step changes timed on the captured batch (an input-bound loop), and how their
    winners were confirmed end to end."""
    if not isinstance(captured, dict):
        return []
    lines = [f"--try step changes on the captured batch (the loop is input-bound: each change timed in this "
             f"process on one batch of yours, compute only, {captured.get('repeats', 0)} interleaved rounds of "
             f"{captured.get('steps', 0)} steps against your step):"]
    if captured.get("error"):
        lines.append(f"  could not time them: {captured['error']}")
    for name, result in (captured.get("changes") or {}).items():
        if "speedup" not in result:
            lines.append(f"  {name:<15} {result.get('error') or 'not timed'}")
            continue
        verdict = "faster" if result["pays_off"] else ("changes the loss" if not result["loss_ok"] else "no gain")
        lines.append(f"  {name:<15} {result['speedup']:.2f}× ({1000 * result['base_s']:.1f} → "
                     f"{1000 * result['variant_s']:.1f} ms/step, noise {result['noise']:.1%}, loss change on the "
                     f"same batch {result['loss_change']:.2%}): {verdict}{_predicted_suffix(result)}")
    together = captured.get("together") or {}
    if together.get("speedup"):
        lines.append(f"  together ({' + '.join(together['changes'])}): {together['speedup']:.2f}× "
                     f"(noise {together['noise']:.1%})")
    winners = captured.get("winners") or []
    if not winners:
        return lines + ["  none faster on compute: none advised"]
    e2e = captured.get("end_to_end") or {}
    label = " + ".join(winners)
    if e2e.get("speedup"):
        lines.append(f"  {label} end to end at {_loader_words(e2e['setting'])}: {e2e['baseline_samples_per_s']:.1f} → "
                     f"{e2e['variant_samples_per_s']:.1f} samples/s, {e2e['speedup']:.2f}× (noise {e2e['noise']:.1%}, "
                     f"{e2e['rounds']} interleaved rounds)")
    elif e2e:
        lines.append(f"  {label} end to end: {e2e.get('not_measured') or e2e.get('error')}")
    advice = {"end to end": "advised with the loader (faster end to end)",
              "step only": "advised as gains once the input pipeline keeps up (measured on the step, not end to "
                           "end: the loader still bounds the loop)",
              "slower end to end": "not advised: slower end to end"}.get(captured.get("advice") or "")
    if advice:
        lines.append(f"  → {label}: {advice}")
    return lines


def _loader_words(setting: dict[str, Any]) -> str:
    return f"num_workers={setting.get('num_workers')}, pin_memory={setting.get('pin_memory')}"


def _not_in_process(result: dict[str, Any]) -> list[str]:
    why = result.get("not_in_process")
    return [f"  re-run, not timed in this process: {why}"] if why else []


def in_process_line(name: str, result: dict[str, Any]) -> str:
    """One change timed in this process on a loop that is not input-bound (perf/torch/in_process_trials.py)."""
    verdict = "pays off" if result["pays_off"] else ("changes the loss" if not result["loss_ok"] else "no gain")
    after = result.get("loss_after_steps")
    loss = f"after {after} steps " if after else ""
    return (f"  {name:<15} {result['speedup']:.2f}× ({1000 * result['base_s']:.1f} → {1000 * result['variant_s']:.1f} "
            f"ms/step, noise {result['noise']:.1%}, loss change {loss}on the same batch {result['loss_change']:.2%}): "
            f"{verdict} — measured on the captured batch{_predicted_suffix(result)}")


def _predicted_suffix(result: dict[str, Any]) -> str:
    bound = (result.get("predicted") or {}).get("bound")
    return f"; predicted up to {bound:.2f}× before measuring" if bound is not None else ""


def not_measured_lines(name: str, result: dict[str, Any]) -> list[str]:
    """A change the budget (or an interruption) left out: its prediction, labelled, and the
    command that measures it alone."""
    from nndoctor.commands.perf.predict import prediction_text

    lines = [f"--try {name}: not measured ({result['not_measured']}); {prediction_text(result.get('predicted') or {})}"]
    if result.get("command"):
        lines.append(f"  measure it alone: {result['command']}")
    return lines


def combined_lines(combined: dict[str, Any] | None) -> list[str]:
    """The paying changes re-run together, and the other changes measured on top of them."""
    if not isinstance(combined, dict):
        return []
    changes = ", ".join(combined["changes"])
    unit = combined.get("unit", "samples/s")
    rate_key = "steps_per_s" if unit == "steps/s" else "samples_per_s"
    if combined.get("not_measured"):
        return [f"--try together ({changes}): not measured ({combined['not_measured']})"]
    if combined.get("error") or not combined.get(rate_key):
        return [f"--try together ({changes}): {combined.get('error') or 'not timed'}"]
    ratio = (f", {combined['speedup']:.2f}× the baseline (interleaved, noise {combined['noise']:.1%})"
             if combined.get("speedup") else "")
    lines = [f"--try together ({changes}): {combined[rate_key]:.1f} {unit}{ratio}"]
    for added in combined.get("added", []):
        name = " + ".join(added["added"])
        if "speedup" in added:
            verdict = "pays off" if added["pays_off"] else "no gain"
            runs = f", {added['runs']} runs each" if added.get("runs", 0) > 3 else ""
            lines.append(f"  + {name}: {added['speedup']:.2f}× on top ({added[rate_key]:.1f} {unit}, "
                         f"noise {added['noise']:.1%}{runs}): {verdict}")
        elif added.get("not_measured"):
            lines.append(f"  + {name}: not measured ({added['not_measured']})")
        else:
            lines.append(f"  + {name}: {added.get('error')}")
    return lines


def batch_size_lines(result: dict[str, Any]) -> list[str]:
    """One line per batch size tried: throughput (the measure that counts) and peak memory."""
    if "speedup" in result:
        verdict = "pays off" if result["pays_off"] else "no gain"
        head = (f"--try batch-size      {result['speedup']:.2f}× samples/s at batch {result['best']['batch_size']} "
                f"(noise {result['noise']:.1%}): {verdict}; the learning rate must follow (see advice)")
    else:
        head = f"--try batch-size: {result.get('skipped') or result.get('error')}"
    lines = [head]
    for row in result["sizes"]:
        size = row.get("batch_size") or "?"
        if row.get("error"):
            error = row["error"]
            if "out of memory" in error.lower():
                error = "does not fit in GPU memory (CUDA out of memory)"
            lines.append(f"  batch {size:<6} ×{row['factor']:<2} {error}")
            continue
        rate = f"{row['samples_per_s']:.1f}" if row.get("samples_per_s") else "-"
        memory = (f", peak GPU memory {row['peak_memory_bytes'] / 2**30:.2f} GiB" if row.get("peak_memory_bytes")
                  else "")
        if memory and row.get("memory_total_bytes"):
            memory += f" of {row['memory_total_bytes'] / 2**30:.0f}"
        step = f"{1000 * row['seconds_per_step']:.1f} ms/step" if row.get("seconds_per_step") else "-"
        lines.append(f"  batch {size:<6} ×{row['factor']:<2} {rate:>10} samples/s  {step}{memory}")
    return lines
