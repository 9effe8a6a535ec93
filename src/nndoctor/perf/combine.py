"""``--try``: the paying changes measured together, then CUDA graphs on top of them.

Each change is first measured alone against the baseline (``rerun.try_changes``). Gains do
not simply multiply: a larger batch changes what bounds the step, and CUDA graphs that gain
nothing at a small batch can pay once the batch is larger (or the reverse). So when two or
more changes paid off, the script is re-run with all of them injected together, interleaved
with the same set plus ``cuda-graphs`` (when it was asked for and is not in the set yet):
the advice then says what the combination measured, and adds CUDA graphs only where they
paid on top of the rest.
"""

from __future__ import annotations

import statistics
from typing import Any

from nndoctor.perf.timeline import speedup_verdict

# Changes whose solo gain can be carried into a combined re-run (loader is timed apart).
COMBINABLE = ("amp", "channels_last", "compile", "tf32", "fused-optimizer", "sdpa", "cudnn-benchmark",
              "cuda-graphs")


def paying_set(results: dict[str, Any]) -> list[str]:
    """The changes that paid off alone, as re-run change names (batch as ``batch-size=K``)."""
    chosen = [name for name in COMBINABLE if (results.get(name) or {}).get("pays_off")]
    batch = results.get("batch-size") or {}
    if batch.get("pays_off") and batch.get("best", {}).get("factor", 1) > 1:
        chosen.append(f"batch-size={batch['best']['factor']}")
    if "compile" in chosen and "cuda-graphs" in chosen:
        chosen.remove("compile")  # reduce-overhead is torch.compile too: one compile, with graphs
    return chosen


def _rates(runs: list[dict[str, Any]]) -> list[float]:
    return [r["seconds_per_step"] / r["samples_per_step"] for r in runs
            if r.get("seconds_per_step") and r.get("samples_per_step")]


def try_combined(results: dict[str, Any], tried: tuple[str, ...], run: Any, *, repeats: int,
                 device: str) -> dict[str, Any] | None:
    """Re-run the paying set together (and with CUDA graphs added); None when there is nothing
    to combine. ``run(changes)`` is one re-run of the script with ``changes`` injected."""
    together = paying_set(results)
    graphs = ("cuda-graphs" in tried and device == "cuda" and "cuda-graphs" not in together
              and not (results.get("cuda-graphs") or {}).get("error"))
    if not together or (len(together) < 2 and not graphs):
        return None
    plus = [name for name in together if name != "compile"] + ["cuda-graphs"] if graphs else None
    runs: dict[str, list[dict[str, Any]]] = {"together": [], **({"plus": []} if plus else {})}
    for _ in range(repeats):
        runs["together"].append(run(together))
        if plus and not any("error" in r for r in runs["plus"]):
            runs["plus"].append(run(plus))
        if "error" in runs["together"][-1]:
            return {"changes": together, "error": runs["together"][-1]["error"]}
    rates = _rates(runs["together"])
    combined: dict[str, Any] = {
        "changes": together, "measure": "re-run",
        "samples_per_s": 1 / statistics.median(rates) if rates else None,
        "seconds_per_sample": rates,
    }
    if plus:
        failed = [r for r in runs["plus"] if "error" in r]
        plus_rates = _rates(runs["plus"])
        if failed or not plus_rates or not rates:
            combined["cuda-graphs"] = {"changes": plus, "error": failed[0]["error"] if failed else "no samples counted"}
        else:
            verdict = speedup_verdict(rates, plus_rates)
            verdict.update({"changes": plus, "samples_per_s": 1 / statistics.median(plus_rates), "unit": "samples/s",
                            "over": together})
            combined["cuda-graphs"] = verdict
    return combined
