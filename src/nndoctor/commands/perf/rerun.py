"""``--try`` for step changes: the user's script run again, unchanged, once per change and
repeat (interleaved, so drifting clocks hit every variant alike), each with the change
injected by ``rerun_child``; the medians give the speed-up, the baseline's repeats the
noise, and the losses show whether a change alters the training beyond its precision.

Because the user's own loop runs, any step works: reshapes and casts between model and
loss, dict batches, losses inside the model, several models and optimizers, accumulation.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from nndoctor.commands.perf import warm_launcher
from nndoctor.commands.perf.timeline import speedup_verdict

# Relative change of the final loss allowed for each change beyond the baseline's own
# run-to-run spread: bf16 keeps 8 mantissa bits (a few % after a deep net and a few steps);
# TF32 has 10; layout, compilation, autotuning and fused kernels only reorder float32 sums.
# SDPA draws its attention dropout from other random numbers than the hand-written code: 2%.
LOSS_TOLERANCE = {"amp": 0.05, "mixed-precision": 0.05, "prefetch": 0.01, "parallel-map": 0.01, "tf32": 0.02, "channels_last": 0.01, "compile": 0.01,
                  "cudnn-benchmark": 0.01, "fused-optimizer": 0.01, "sdpa": 0.02, "cuda-graphs": 0.01}
CUDA_ONLY = {"cudnn-benchmark": "cuDNN autotuning acts on CUDA devices only",
             "tf32": "TF32 acts on CUDA devices only",
             "cuda-graphs": "CUDA graphs (torch.compile mode='reduce-overhead') need a CUDA device"}
# Changes compiled on their first calls: the window starts after at least this many steps.
COMPILED = ("compile", "cuda-graphs", "sdpa")
MIN_COMPILED_WARMUP = 3
# The fewest warm-up steps of a re-run whose step times are already stable (rerun_child).
MIN_STABLE_WARMUP = 2
# --try batch-size: K times the batch, larger K only while the smaller fit.
BATCH_FACTORS = {"cuda": (2, 4, 8), "cpu": (2, 4)}
CHILD_TIMEOUT_S = float(os.environ.get("NNDOCTOR_TRY_TIMEOUT", "900"))
_STDERR_TAIL = 4000
# A re-run's measured window lasts at least this long: on an H100, 200 steps of a 2 ms step
# (0.4 s) gave repeat spreads of 27–39%, too wide to tell a 1.3× gain from noise. Short steps
# get more steps (at most MAX_WINDOW_FACTOR × --steps); a script that ends sooner is timed
# over the steps it ran, if it ran at least --steps of them.
MIN_WINDOW_S = 1.0
MAX_WINDOW_FACTOR = 20


def window_steps(steps: int, step_seconds: float | None) -> int:
    """Measured steps per re-run: ``steps``, or more when they would last under MIN_WINDOW_S."""
    if not step_seconds or step_seconds <= 0 or steps * step_seconds >= MIN_WINDOW_S:
        return steps
    return min(steps * MAX_WINDOW_FACTOR, math.ceil(MIN_WINDOW_S / step_seconds))


CHILD = "nndoctor.commands.perf.torch.rerun_child"  # the TensorFlow re-run is nndoctor.commands.perf.tf.rerun_child


def child_command(target: Any, changes: list[str], warmup: int, steps: int, out: str,
                  min_steps: int | None = None, child: str = CHILD, min_warmup: int | None = None) -> list[str]:
    command = [sys.executable, "-m", child, "--changes", ",".join(changes),
               "--warmup", str(warmup), "--steps", str(steps), "--out", out]
    if min_warmup is not None and min_warmup < warmup:
        command += ["--min-warmup", str(min_warmup)]
    if min_steps is not None and min_steps < steps:
        command += ["--min-steps", str(min_steps)]
    if target.is_module:
        return command + ["-m", target.name, "--", *target.args]
    return command + ["--", target.name, *target.args]


def run_child(target: Any, changes: list[str], warmup: int, steps: int, cwd: str,
              min_steps: int | None = None, child: str = CHILD, env: dict[str, str] | None = None,
              min_warmup: int | None = None, timeout_s: float | None = None) -> dict[str, Any]:
    """One re-run; the child's own output is kept only to explain a failure. ``env``: variables
    set for the re-run on top of this process's environment (the run-private compile cache).
    ``timeout_s``: killed after this long (default CHILD_TIMEOUT_S)."""
    timeout = CHILD_TIMEOUT_S if timeout_s is None else timeout_s
    with tempfile.TemporaryDirectory(prefix="nndoctor-try-") as folder:
        out = os.path.join(folder, "result.json")
        log = os.path.join(folder, "log.txt")
        command = child_command(target, changes, warmup, steps, out, min_steps, child, min_warmup)
        try:
            returncode = _launch(command, child, cwd, log, {**os.environ, **(env or {})}, timeout)
        except subprocess.TimeoutExpired:
            why = "NNDOCTOR_TRY_TIMEOUT" if timeout_s is None else "the budget left, or NNDOCTOR_TRY_TIMEOUT"
            return {"error": f"the re-run did not finish within {timeout:.0f} s ({why})"}
        if os.path.exists(out):
            with open(out) as handle:
                return json.load(handle)
        with open(log, errors="replace") as handle:
            tail = handle.read()[-_STDERR_TAIL:].strip().splitlines()
        return {"error": f"the re-run exited with status {returncode}: {tail[-1] if tail else 'no output'}"}


def _launch(command: list[str], child: str, cwd: str, log: str, env: dict[str, str] | None = None,
            timeout: float = CHILD_TIMEOUT_S) -> int:
    """Run ``python -m child ARGS`` (``command``): forked from a warm helper that has torch
    imported when it can be (warm_launcher), else in a fresh process; its return code."""
    if warm_launcher.enabled(child):
        try:
            return warm_launcher.launcher_for(child).run(command[3:], cwd, log, timeout, env=env)
        except warm_launcher.LauncherFailed:
            pass  # the same re-run in a fresh process
    with open(log, "w") as handle:
        done = subprocess.run(command, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT, env=env,
                              stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    return done.returncode


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _relative_spread(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return 0.0
    middle = statistics.median(present)
    return (max(present) - min(present)) / max(abs(middle), 1e-12)


def try_changes(target: Any, changes: tuple[str, ...], *, warmup: int, steps: int, repeats: int,
                cwd: str, device: str, min_steps: int | None = None, child: str = CHILD) -> dict[str, Any]:
    """Interleaved re-runs of the baseline and each change; a verdict per change. ``steps``
    is the window; a run that ends after ``min_steps`` of it still counts."""
    results: dict[str, Any] = {}
    wanted = list(changes)
    if device != "cuda":
        for name, why in CUDA_ONLY.items():
            if name in wanted:
                results[name] = {"skipped": f"{why}; this run trained on {device}"}
                wanted.remove(name)
    if not wanted:
        return results
    if any(name in COMPILED for name in wanted):
        warmup = max(warmup, MIN_COMPILED_WARMUP)  # compilation stays out of every window
    variants = [name for name in wanted if name != "batch-size"]
    factors = BATCH_FACTORS["cuda" if device == "cuda" else "cpu"] if "batch-size" in wanted else ()
    variants += [f"batch-size={k}" for k in factors]
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], **{name: [] for name in variants}}
    for _ in range(repeats):
        for name in runs:
            if name != "baseline" and runs[name] and "error" in runs[name][-1]:
                continue  # a change that failed once fails again: do not pay for it twice
            if name.startswith("batch-size=") and _smaller_batch_failed(runs, name):
                continue  # K times the batch did not fit: 2K will not either
            runs[name].append(run_child(target, [] if name == "baseline" else [name], warmup, steps, cwd,
                                        min_steps, child))
        if "error" in runs["baseline"][-1]:
            error = runs["baseline"][-1]["error"]
            for name in wanted:
                results[name] = {"error": f"the script does not run to the end of the window without changes: {error}"}
            return results
    base_times = [r["seconds_per_step"] for r in runs["baseline"]]
    base_final = [r.get("final_loss") for r in runs["baseline"]]
    if factors:
        results["batch-size"] = summarize_batch_sizes(runs, factors)
    for name in (n for n in wanted if n != "batch-size"):
        results[name] = change_verdict(name, runs["baseline"], runs[name])
    results["baseline"] = {"times_s": base_times, "loss": _median(base_final), "measure": "re-run",
                           "repeats": repeats, "warmup": warmup, "steps": steps}
    return results


def change_verdict(name: str, baseline: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One change's result from its re-runs and the baseline's: an error, a skip (the change
    applied nowhere), or the speed-up verdict with the loss check."""
    base_times = [r["seconds_per_step"] for r in baseline]
    base_final = [r.get("final_loss") for r in baseline]
    failed = [r for r in runs if "error" in r]
    if failed:
        return {"error": f"{failed[0]['error']} (the script with --try {name} injected)",
                "applied": failed[0].get("applied", [])}
    if not any(r.get("applied") for r in runs):
        notes = [n for r in runs for n in r.get("notes", [])]
        return {"skipped": "; ".join(dict.fromkeys(notes)) or _not_applicable(name)}
    verdict = speedup_verdict(base_times, [r["seconds_per_step"] for r in runs])
    final = [r.get("final_loss") for r in runs]
    base_loss, variant_loss = _median(base_final), _median(final)
    change = (abs(variant_loss - base_loss) / max(abs(base_loss), 1e-12)
              if base_loss is not None and variant_loss is not None else None)
    allowed = LOSS_TOLERANCE.get(name, 0.01) + 3 * _relative_spread(base_final)
    # A loop whose loss nndoctor cannot read (a TF step returning nothing) is timed unchecked.
    unchecked = base_loss is None and variant_loss is None
    verdict.update({
        "loss_baseline": base_loss, "loss_variant": variant_loss, "loss_change": change,
        "loss_allowed": allowed, "loss_checked": not unchecked,
        "loss_ok": unchecked or (change is not None and change <= allowed),
        "times_s": [r["seconds_per_step"] for r in runs],
        "applied": runs[0].get("applied", []),
        "notes": runs[0].get("notes", []),
        "measure": "re-run",
    })
    verdict["pays_off"] = bool(verdict["pays_off"] and verdict["loss_ok"])
    per_rank = [r["rank_seconds_per_step"] for r in runs if r.get("rank_seconds_per_step")]
    if per_rank:  # a re-run of every rank (torchrun): each rank's median step
        verdict["rank_seconds_per_step"] = [statistics.median(times) for times in zip(*per_rank)]
    return verdict


def _smaller_batch_failed(runs: dict[str, list[dict[str, Any]]], name: str) -> bool:
    factor = int(name.split("=")[1])
    return any(int(other.split("=")[1]) < factor and any("error" in r for r in done)
               for other, done in runs.items() if other.startswith("batch-size="))


def _batch_size(applied: list[str]) -> tuple[int, int] | None:
    """(before, after) from the injector's "batch_size 64 → 128"."""
    for entry in applied:
        if entry.startswith("batch_size "):
            before, after = entry.removeprefix("batch_size ").split(" → ")
            return int(before), int(after)
    return None


def _row(runs: list[dict[str, Any]], factor: int, batch_size: int | None) -> dict[str, Any]:
    from nndoctor.commands.perf.combine import loop_seconds_per_step

    # With the data wait: a larger batch also loads more (see combine.loop_seconds_per_step).
    rates = [r["samples_per_step"] / loop_seconds_per_step(r) for r in runs
             if r.get("samples_per_step") and loop_seconds_per_step(r)]
    memory = [r["peak_memory_bytes"] for r in runs if r.get("peak_memory_bytes")]
    total = next((r["memory_total_bytes"] for r in runs if r.get("memory_total_bytes")), None)
    return {"factor": factor, "batch_size": batch_size,
            "samples_per_s": statistics.median(rates) if rates else None,
            "seconds_per_step": _median([r.get("seconds_per_step") for r in runs]),
            "peak_memory_bytes": max(memory) if memory else None, "memory_total_bytes": total,
            "seconds_per_sample": [1 / rate for rate in rates]}


def summarize_batch_sizes(runs: dict[str, list[dict[str, Any]]], factors: tuple[int, ...]) -> dict[str, Any]:
    """Samples/s and peak memory per batch size (the baseline is factor 1); the best that fits.

    Throughput, not step time: a larger batch makes each step slower and the epoch shorter.
    The loss is not compared — a larger batch is a different optimisation (see the advice's
    learning-rate note), so "pays off" speaks of speed only."""
    sizes = {k: _batch_size(next((r["applied"] for r in runs[f"batch-size={k}"] if r.get("applied")), []))
             for k in factors}
    base_size = next((pair[0] for pair in sizes.values() if pair), None)
    rows = [_row(runs["baseline"], 1, base_size)]
    for k in factors:
        done = runs[f"batch-size={k}"]
        size = sizes[k]
        if not done:
            rows.append({"factor": k, "batch_size": base_size * k if base_size else None,
                         "error": "not tried: a smaller batch already did not fit or failed"})
        elif any("error" in r for r in done):
            rows.append({"factor": k, "batch_size": size[1] if size else None,
                         "error": next(r["error"] for r in done if "error" in r)})
        elif size is not None:
            rows.append(_row(done, k, size[1]))
    if base_size is None or not rows[0]["samples_per_s"]:
        return {"skipped": "the batches do not come from a torch DataLoader/BatchSampler whose batch_size could "
                           "be changed (e.g. tensors made in the loop)", "sizes": rows}
    measured = [r for r in rows if r.get("samples_per_s")]
    best = max(measured, key=lambda r: r["samples_per_s"])
    verdict = speedup_verdict(rows[0]["seconds_per_sample"], best["seconds_per_sample"])
    verdict.update({"sizes": rows, "best": best, "measure": "re-run", "unit": "samples/s",
                    "pays_off": bool(verdict["pays_off"] and best["factor"] > 1)})
    return verdict


def _not_applicable(name: str) -> str:
    if name == "fused-optimizer":
        return "no Adam, AdamW, SGD or Adagrad optimizer to switch to fused kernels"
    if name == "sdpa":
        return "no hand-written attention (softmax(Q Kᵀ) V) in the training forward"
    if name == "prefetch":
        return "every dataset the script iterated already ends with a prefetch"
    if name == "parallel-map":
        return "no Dataset.map without num_parallel_calls in the pipeline"
    return f"nothing in the training loop that {name} applies to"
