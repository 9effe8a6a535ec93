"""``--try`` for step changes: the user's script run again, unchanged, once per change and
repeat (interleaved, so drifting clocks hit every variant alike), each with the change
injected by ``rerun_child``; the medians give the speed-up, the baseline's repeats the
noise, and the losses show whether a change alters the training beyond its precision.

Because the user's own loop runs, any step works: reshapes and casts between model and
loss, dict batches, losses inside the model, several models and optimizers, accumulation.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from nndoctor.perf.timeline import speedup_verdict

# Relative change of the final loss allowed for each change beyond the baseline's own
# run-to-run spread: bf16 keeps 8 mantissa bits (a few % after a deep net and a few steps);
# TF32 has 10; layout, compilation, autotuning and fused kernels only reorder float32 sums.
LOSS_TOLERANCE = {"amp": 0.05, "tf32": 0.02, "channels_last": 0.01, "compile": 0.01,
                  "cudnn-benchmark": 0.01, "fused-optimizer": 0.01}
CHILD_TIMEOUT_S = float(os.environ.get("NNDOCTOR_TRY_TIMEOUT", "900"))
_STDERR_TAIL = 4000


def child_command(target: Any, changes: list[str], warmup: int, steps: int, out: str) -> list[str]:
    command = [sys.executable, "-m", "nndoctor.perf.rerun_child", "--changes", ",".join(changes),
               "--warmup", str(warmup), "--steps", str(steps), "--out", out]
    if target.is_module:
        return command + ["-m", target.name, "--", *target.args]
    return command + ["--", target.name, *target.args]


def run_child(target: Any, changes: list[str], warmup: int, steps: int, cwd: str) -> dict[str, Any]:
    """One re-run; the child's own output is kept only to explain a failure."""
    with tempfile.TemporaryDirectory(prefix="nndoctor-try-") as folder:
        out = os.path.join(folder, "result.json")
        log = os.path.join(folder, "log.txt")
        with open(log, "w") as handle:
            try:
                done = subprocess.run(child_command(target, changes, warmup, steps, out), cwd=cwd,
                                      stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      timeout=CHILD_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                return {"error": f"the re-run did not finish within {CHILD_TIMEOUT_S:.0f} s "
                                 "(NNDOCTOR_TRY_TIMEOUT)"}
        if os.path.exists(out):
            with open(out) as handle:
                return json.load(handle)
        with open(log, errors="replace") as handle:
            tail = handle.read()[-_STDERR_TAIL:].strip().splitlines()
        return {"error": f"the re-run exited with status {done.returncode}: {tail[-1] if tail else 'no output'}"}


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
                cwd: str, device: str) -> dict[str, Any]:
    """Interleaved re-runs of the baseline and each change; a verdict per change."""
    results: dict[str, Any] = {}
    wanted = list(changes)
    if device != "cuda":
        for name in ("cudnn-benchmark", "tf32"):
            if name in wanted:
                results[name] = {"skipped": f"{name} acts on CUDA devices only; this run trained on {device}"}
                wanted.remove(name)
    if not wanted:
        return results
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], **{name: [] for name in wanted}}
    for _ in range(repeats):
        for name in runs:
            if name != "baseline" and runs[name] and "error" in runs[name][-1]:
                continue  # a change that failed once fails again: do not pay for it twice
            runs[name].append(run_child(target, [] if name == "baseline" else [name], warmup, steps, cwd))
        if "error" in runs["baseline"][-1]:
            error = runs["baseline"][-1]["error"]
            for name in wanted:
                results[name] = {"error": f"the script does not run to the end of the window without changes: {error}"}
            return results
    base_times = [r["seconds_per_step"] for r in runs["baseline"]]
    base_final = [r.get("final_loss") for r in runs["baseline"]]
    for name in wanted:
        failed = [r for r in runs[name] if "error" in r]
        if failed:
            results[name] = {"error": f"{failed[0]['error']} (the script with --try {name} injected)",
                             "applied": failed[0].get("applied", [])}
            continue
        if not any(r.get("applied") for r in runs[name]):
            results[name] = {"skipped": _not_applicable(name)}
            continue
        verdict = speedup_verdict(base_times, [r["seconds_per_step"] for r in runs[name]])
        final = [r.get("final_loss") for r in runs[name]]
        base_loss, variant_loss = _median(base_final), _median(final)
        change = (abs(variant_loss - base_loss) / max(abs(base_loss), 1e-12)
                  if base_loss is not None and variant_loss is not None else None)
        allowed = LOSS_TOLERANCE.get(name, 0.01) + 3 * _relative_spread(base_final)
        verdict.update({
            "loss_baseline": base_loss, "loss_variant": variant_loss, "loss_change": change,
            "loss_allowed": allowed,
            "loss_ok": change is not None and change <= allowed,
            "times_s": [r["seconds_per_step"] for r in runs[name]],
            "applied": runs[name][0].get("applied", []),
            "measure": "re-run",
        })
        verdict["pays_off"] = bool(verdict["pays_off"] and verdict["loss_ok"])
        results[name] = verdict
    results["baseline"] = {"times_s": base_times, "loss": _median(base_final), "measure": "re-run",
                           "repeats": repeats, "warmup": warmup, "steps": steps}
    return results


def _not_applicable(name: str) -> str:
    if name == "fused-optimizer":
        return "no Adam, AdamW, SGD or Adagrad optimizer to switch to fused kernels"
    return f"nothing in the training loop that {name} applies to"
