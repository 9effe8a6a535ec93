"""``--try``: the paying changes measured together, and the others measured on top of them.

Each change is first measured alone against the baseline (``rerun.try_changes``). Gains do
not simply multiply: a larger batch changes what bounds the step, and CUDA graphs or a
fused optimizer that gain nothing at a small batch can pay once the batch is larger (or the
reverse). So the script is re-run with the paying changes injected together, interleaved
with the same set plus each change that did not pay alone (and plus all of them): the
advice adds a change only where it paid on top of the rest, and says so.
"""

from __future__ import annotations

import statistics
from typing import Any

from nndoctor.commands.perf.timeline import speedup_verdict

# Changes whose solo gain can be carried into a combined re-run (loader is timed apart).
COMBINABLE = ("amp", "channels_last", "compile", "tf32", "fused-optimizer", "sdpa", "cudnn-benchmark",
              "cuda-graphs", "ddp-bucket-view", "ddp-static-graph", "ddp-bucket-cap", "ddp-no-sync")


def paying_set(results: dict[str, Any]) -> list[str]:
    """The changes that paid off alone, as re-run change names (batch as ``batch-size=K``)."""
    chosen = [name for name in COMBINABLE if (results.get(name) or {}).get("pays_off")]
    batch = results.get("batch-size") or {}
    if batch.get("pays_off") and batch.get("best", {}).get("factor", 1) > 1:
        chosen.append(f"batch-size={batch['best']['factor']}")
    if "compile" in chosen and "cuda-graphs" in chosen:
        chosen.remove("compile")  # reduce-overhead is torch.compile too: one compile, with graphs
    return chosen


def loop_seconds_per_step(run: dict[str, Any]) -> float | None:
    """A re-run's seconds per step with its data wait: on an input-bound loop ``seconds_per_step``
    leaves the wait out (step changes cannot shorten it), but K times the batch loads K times the
    samples, so samples/s must count the wait."""
    return run.get("wall_seconds_per_step") or run.get("seconds_per_step")


def seconds_per_unit(runs: list[dict[str, Any]], per_sample: bool = True) -> list[float]:
    """Seconds per sample (a larger batch is among the changes; the data wait counted) or per
    step (it is not: then batches made in the loop, which no DataLoader counts, are fine)."""
    if not per_sample:
        return [r["seconds_per_step"] for r in runs if r.get("seconds_per_step")]
    return [loop_seconds_per_step(r) / r["samples_per_step"] for r in runs
            if loop_seconds_per_step(r) and r.get("samples_per_step")]


def additions(results: dict[str, Any], tried: tuple[str, ...], together: list[str], device: str) -> list[str]:
    """Changes measured alone without paying (and without changing the loss) that may pay on
    top of the paying set: CUDA graphs or a fused optimizer often pay only at a larger batch."""
    found = []
    for name in COMBINABLE:
        outcome = results.get(name) or {}
        if name not in tried or name in together or "speedup" not in outcome or not outcome.get("loss_ok", True):
            continue
        if name == "cuda-graphs" and device != "cuda":
            continue
        found.append(name)
    return found[:MAX_ADDITIONS]


MAX_ADDITIONS = 3
# An addition whose median gain exceeds the floor but not the noise is undecided: it gets
# more interleaved rounds (with the paying set), up to this many in all, then is judged on
# them (from 5 rounds on, the noise leaves out each side's extreme run).
MAX_ROUNDS = 5
GAIN_FLOOR = 0.03


def with_added(together: list[str], added: list[str]) -> list[str]:
    base = [name for name in together if not (name == "compile" and "cuda-graphs" in added)]
    return base + added


def try_combined(results: dict[str, Any], tried: tuple[str, ...], run: Any, *, repeats: int,
                 device: str) -> dict[str, Any] | None:
    """Re-run the paying set together, alone and with each other measured change added (and
    with all of them); None when there is nothing to combine. ``run(changes)`` is one re-run
    of the script with ``changes`` injected."""
    together = paying_set(results)
    extra = additions(results, tried, together, device)
    if not together or (len(together) < 2 and not extra):
        return None
    added_sets = [[name] for name in extra] + ([extra] if len(extra) > 1 else [])
    variants = {"together": together, **{"+" + "+".join(a): with_added(together, a) for a in added_sets}}
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key in variants}
    for _ in range(repeats):
        for key, changes in variants.items():
            if runs[key] and "error" in runs[key][-1]:
                continue
            runs[key].append(run(changes))
        if "error" in runs["together"][-1]:
            return {"changes": together, "error": runs["together"][-1]["error"]}
    per_sample = any(name.startswith("batch-size=") for changes in variants.values() for name in changes)
    _settle_undecided(variants, runs, run, per_sample)
    rates = seconds_per_unit(runs["together"], per_sample)
    unit, rate_key = ("samples/s", "samples_per_s") if per_sample else ("steps/s", "steps_per_s")
    combined: dict[str, Any] = {
        "changes": together, "measure": "re-run", "unit": unit,
        rate_key: 1 / statistics.median(rates) if rates else None,
        "seconds_per_" + ("sample" if per_sample else "step"): rates, "added": [],
    }
    if not rates:
        combined["error"] = ("no samples counted: a larger batch is among the changes, but no DataLoader "
                             "delivered the batches" if per_sample else "no step timed")
    for added in added_sets:
        key = "+" + "+".join(added)
        failed = [r for r in runs[key] if "error" in r]
        added_rates = seconds_per_unit(runs[key], per_sample)
        if failed or not added_rates or not rates:
            combined["added"].append({"added": added, "error": failed[0]["error"] if failed
                                      else "not timed (see the set it was added to)"})
            continue
        verdict = speedup_verdict(rates, added_rates)
        verdict.update({"added": added, "changes": variants[key], rate_key: 1 / statistics.median(added_rates),
                        "unit": unit, "over": together, "runs": len(added_rates)})
        combined["added"].append(verdict)
    paying = [v for v in combined["added"] if v.get("pays_off")]
    combined["best_added"] = max(paying, key=lambda v: v["speedup"]) if paying else None
    return combined


def _undecided(runs: dict[str, list[dict[str, Any]]], per_sample: bool) -> list[str]:
    base = seconds_per_unit(runs["together"], per_sample)
    found = []
    for key, done in runs.items():
        rates = seconds_per_unit(done, per_sample)
        if key == "together" or any("error" in r for r in done) or not rates or not base:
            continue
        verdict = speedup_verdict(base, rates, floor=GAIN_FLOOR)
        if not verdict["pays_off"] and verdict["speedup"] > 1 + GAIN_FLOOR:
            found.append(key)
    return found


def _settle_undecided(variants: dict[str, list[str]], runs: dict[str, list[dict[str, Any]]], run: Any,
                      per_sample: bool) -> None:
    """More rounds of the paying set and each undecided addition, interleaved, until each is
    decided or has MAX_ROUNDS runs: a noisy machine gets more samples, not a coin toss."""
    while True:
        pending = [key for key in _undecided(runs, per_sample) if len(runs[key]) < MAX_ROUNDS]
        if not pending or len(runs["together"]) >= MAX_ROUNDS:
            return
        runs["together"].append(run(variants["together"]))
        if "error" in runs["together"][-1]:
            runs["together"].pop()
            return
        for key in pending:
            runs[key].append(run(variants[key]))
