"""``--try`` step changes within a time budget: the most promising first, each re-run only as
often as its verdict needs, the winners then measured together — and a report that keeps
every finished trial when the budget, Ctrl-C or SIGTERM ends it early.

- **Budget** (``--budget``, seconds, the measured window of the script included): a re-run
  starts only when its estimated cost (the measured cost of that kind of re-run; compiled
  changes cost more) fits in what is left, so the run ends at most one re-run past it. Every
  change left out says so (``not_measured``), with its predicted gain and the command that
  measures it alone.
- **Order** from ``predict.plan``: skipped changes carry their reason and never run.
- **Adaptive repeats**: a change is re-run again (interleaved with another baseline re-run)
  only while its speed-up is within twice the timing noise; a 2× gain is clear after one
  re-run, a 3% one needs up to ``--try-repeats``.
- **Together**: the changes that paid alone, re-run as one set interleaved with the baseline;
  the advice names the best measured point (the set, the set plus a change that paid on top,
  or the best single change) with its measured ratio.
- **Cheap re-runs**: every re-run shares one run-private inductor cache directory
  (``TORCHINDUCTOR_CACHE_DIR``, FX graph and autograd caches on), so a change compiled once is
  loaded from the cache by its repeats and by the combination.
"""

from __future__ import annotations

import shlex
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nndoctor.commands.perf import combine, rerun
from nndoctor.commands.perf.predict import COMPILING, prediction_text
from nndoctor.commands.perf.timeline import relative_noise, speedup_verdict

DEFAULT_BUDGET_S = 300.0
# Noise assumed before the baseline has been re-run twice (then the measured spread counts):
# repeat spreads of a few % on a dedicated GPU; a CPU shared with other work spreads more.
NOISE_PRIOR = {"cuda": 0.05, "cpu": 0.15}
GAIN_FLOOR = 0.03
# Before a re-run of a kind was timed, it is estimated at a plain re-run plus this much:
# Inductor compiles the forward and backward (compile, cuda-graphs); sdpa alone only traces
# the attention modules with Dynamo and runs them eagerly.
COMPILE_GUESS_S = {"inductor": {"cuda": 60.0, "cpu": 20.0}, "dynamo": {"cuda": 10.0, "cpu": 5.0}}
# A re-run starts only when 1.15× its estimate fits: re-runs of one kind vary by ~10%, and the
# run should end inside the budget, not one re-run past it.
SAFETY = 1.15

RunChild = Callable[[list[str]], dict[str, Any]]


@dataclass
class Budget:
    """Seconds allowed from ``started`` (time.monotonic) on."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def fits(self, estimate: float) -> bool:
        return self.left() >= estimate


class Interrupted(Exception):
    """Raised inside the scheduler when a trial was interrupted (internal)."""


@dataclass
class Pool:
    """The re-runs of one configuration (a list of changes)."""

    changes: list[str]
    runs: list[dict[str, Any]] = field(default_factory=list)

    def times(self, per_sample: bool = False) -> list[float]:
        return combine.seconds_per_unit(self.ok_runs(), per_sample)

    def ok_runs(self) -> list[dict[str, Any]]:
        return [r for r in self.runs if "error" not in r and r.get("seconds_per_step")]


def decided(base: list[float], variant: list[float], prior: float = NOISE_PRIOR["cuda"]) -> bool:
    """Is the verdict clear against the noise? Clearly faster (gain over twice the noise) or
    clearly slower (a loss over the noise)."""
    if not base or not variant:
        return False
    noise = relative_noise(base) if len(base) >= 2 else 0.0
    noise = max(noise, relative_noise(variant), prior if len(base) < 2 else 0.0, GAIN_FLOOR)
    gain = statistics.median(base) / statistics.median(variant) - 1.0
    return gain > 2 * noise or gain < -noise


class TrialScheduler:
    """Runs the planned step changes against the baseline within the budget."""

    def __init__(self, run_child: Callable[..., dict[str, Any]], *, budget: Budget, repeats: int,
                 device: str, announce: Callable[[str], None] | None = None,
                 measure_alone: Callable[[str], str] | None = None, first_estimate: float = 0.0,
                 noise_floor: float = 0.0) -> None:
        self._run_child = run_child
        # The noise assumed until the baseline was re-run twice: the device's prior, or more
        # when the script's own window already varied more (step times' spread / √steps).
        self.noise_prior = max(NOISE_PRIOR.get(device, NOISE_PRIOR["cpu"]), noise_floor)
        # Before any re-run was timed: what the script took to reach the end of its measured
        # window in this process (start, model build, warm-up, window) — one re-run's work.
        self.first_estimate = first_estimate
        self.budget, self.repeats, self.device = budget, repeats, device
        self.announce = announce or (lambda line: None)
        self.measure_alone = measure_alone or (lambda name: f"nndoctor perf --try {name} SCRIPT")
        self.baseline = Pool([])
        self.costs: dict[str, list[float]] = {"plain": [], "inductor": [], "dynamo": []}
        self.interrupted: str | None = None
        self.runs_done = 0
        self.all_runs: list[dict[str, Any]] = []

    # -- costs -----------------------------------------------------------------------------
    @staticmethod
    def cost_kind(changes: list[str]) -> str:
        if any(c in ("compile", "cuda-graphs") for c in changes):
            return "inductor"
        return "dynamo" if any(c in COMPILING for c in changes) else "plain"

    def estimate(self, changes: list[str]) -> float:
        kind = self.cost_kind(changes)
        if self.costs[kind]:
            return statistics.median(self.costs[kind])
        plain = statistics.median(self.costs["plain"]) if self.costs["plain"] else self.first_estimate
        if kind == "plain":
            return plain
        return plain + COMPILE_GUESS_S[kind].get(self.device, COMPILE_GUESS_S[kind]["cpu"])

    def run(self, changes: list[str], label: str) -> dict[str, Any]:
        """One re-run, announced with its ETA, its cost recorded."""
        estimate = self.estimate(changes)
        eta = f", ETA ~{estimate:.0f} s" if estimate else ""
        self.announce(f"re-run {self.runs_done + 1}: {label}{eta}; {max(0.0, self.budget.left()):.0f} s "
                      f"of the budget left")
        started = time.monotonic()
        try:
            result = self._run_child(changes)
        except KeyboardInterrupt:
            self.interrupted = self.interrupted or "interrupted (Ctrl-C or SIGTERM)"
            raise Interrupted from None
        cost = time.monotonic() - started
        self.runs_done += 1
        result.setdefault("wall_s", round(cost, 2))
        self.all_runs.append(result)
        if "error" not in result:
            self.costs[self.cost_kind(changes)].append(cost)
        return result

    def fits(self, changes: list[str], extra: float = 0.0) -> bool:
        return self.budget.fits(SAFETY * (self.estimate(changes) + extra))

    # -- the baseline --------------------------------------------------------------------------
    def baseline_run(self) -> dict[str, Any]:
        result = self.run([], "baseline (no change)")
        self.baseline.runs.append(result)
        if "error" not in result:
            self.announce(f"  baseline: {1000 * result['seconds_per_step']:.1f} ms/step "
                          f"(re-run took {result['wall_s']:.1f} s)")
        return result

    # -- one change, adaptively ------------------------------------------------------------------
    def measure(self, name: str, changes: list[str], reference: Pool, *, per_sample: bool = False,
                label: str | None = None) -> tuple[Pool, str]:
        """Re-run ``changes`` until the verdict against ``reference`` is clear or the repeats
        are spent, each further run preceded by another reference run (interleaved). Returns
        the pool and why it stopped: "clear", "repeats", "budget", "error" or "not applied"."""
        pool = Pool(changes)
        label = label or name
        while True:
            extra = self.estimate(reference.changes) if pool.runs else 0.0
            if not self.fits(changes, extra):
                return pool, "budget"
            if pool.runs:  # interleave: the reference again, then the variant
                reference.runs.append(self.run(reference.changes, f"{_label(reference.changes)} (reference for "
                                                                  f"{label})"))
            result = self.run(changes, label)
            pool.runs.append(result)
            if "error" in result:
                self.announce(f"  {label}: failed — {result['error']}")
                return pool, "error"
            if not result.get("applied"):
                self.announce(f"  {label}: not applied — {'; '.join(result.get('notes') or []) or 'nothing to act on'}")
                return pool, "not applied"
            base, variant = reference.times(per_sample), pool.times(per_sample)
            if base and variant:
                ratio = statistics.median(base) / statistics.median(variant)
                unit = "sample" if per_sample else "step"
                self.announce(f"  {label}: {_ms(statistics.median(variant), unit)} vs {_ms(statistics.median(base), unit)}"
                              f" → {ratio:.2f}× after {len(variant)} run(s)")
            if decided(base, variant, self.noise_prior):
                return pool, "clear"
            if len(pool.runs) >= self.repeats:
                return pool, "repeats"

    # -- the whole schedule ----------------------------------------------------------------------
    def run_all(self, order: list[str], predictions: dict[str, dict[str, Any]],
                results: dict[str, Any]) -> None:
        """Fill ``results`` (in place, so an interruption keeps what finished)."""
        for name, prediction in predictions.items():
            if "skip" in prediction:
                results[name] = {"skipped": prediction["skip"], "predicted": prediction}
        try:
            self._run_all(order, predictions, results)
        except (Interrupted, KeyboardInterrupt):
            self.interrupted = self.interrupted or "interrupted (Ctrl-C or SIGTERM)"
        for name in order:
            if name not in results:
                why = "budget" if self.interrupted is None else "interrupted"
                results[name] = self.not_measured(name, predictions[name], why)
        if self.interrupted:
            results["interrupted"] = self.interrupted

    def not_measured(self, name: str, prediction: dict[str, Any], why: str) -> dict[str, Any]:
        return {"not_measured": why, "predicted": prediction, "command": self.measure_alone(name),
                "text": f"not measured ({why}): {prediction_text(prediction)}"}

    def _run_all(self, order: list[str], predictions: dict[str, dict[str, Any]],
                 results: dict[str, Any]) -> None:
        if not order and len(together_set(results)) < 2:
            return  # (with no change to re-run, the set of those decided in process may still be)
        if not self.fits(order[:1], extra=self.estimate([])):
            self.announce(f"the budget has {max(0.0, self.budget.left()):.0f} s left: not enough for a baseline "
                          f"re-run and one change (~{self.estimate([]) + self.estimate(order[:1]):.0f} s)")
            return
        first = self.baseline_run()
        if "error" in first:
            for name in order:
                results[name] = {"error": f"the script does not run to the end of the window without changes: "
                                          f"{first['error']}", "predicted": predictions[name]}
            return
        for index, name in enumerate(order, 1):
            bound = predictions[name].get("bound")
            self.announce(f"[{index}/{len(order)}] --try {name}"
                          + (f" (predicted up to {bound:.2f}×)" if bound is not None else ""))
            if name == "batch-size":
                self._batch_sizes(results, predictions[name])
                continue
            pool, why = self.measure(name, [name], self.baseline)
            if why == "budget" and not pool.runs:
                results[name] = self.not_measured(name, predictions[name], "budget")
                self.announce(f"  {name}: not measured (budget)")
                continue
            verdict = rerun.change_verdict(name, self.baseline.ok_runs(), pool.runs)
            verdict.update({"predicted": predictions[name], "runs": len(pool.runs), "stopped": why})
            results[name] = verdict
            if "speedup" in verdict:
                self.announce(f"  {name}: {verdict['speedup']:.2f}× ({'pays off' if verdict['pays_off'] else 'no gain'}"
                              f", {len(pool.runs)} run(s), stopped: {why})")
        self._together(results, order, predictions)

    def _batch_sizes(self, results: dict[str, Any], prediction: dict[str, Any]) -> None:
        factors = rerun.BATCH_FACTORS["cuda" if self.device == "cuda" else "cpu"]
        runs: dict[str, list[dict[str, Any]]] = {"baseline": self.baseline.ok_runs()}
        measured: list[int] = []
        for factor in factors:
            name = f"batch-size={factor}"
            pool, why = self.measure(name, [name], self.baseline, per_sample=True)
            runs[name] = pool.runs
            if why == "budget" and not pool.runs:
                break
            measured.append(factor)
            if why == "error":
                break  # K times the batch did not fit: 2K will not either
        if not measured:
            results["batch-size"] = self.not_measured("batch-size", prediction, "budget")
            return
        runs["baseline"] = self.baseline.ok_runs()
        summary = rerun.summarize_batch_sizes(runs, tuple(measured))
        summary["predicted"] = prediction
        results["batch-size"] = summary

    # -- together ------------------------------------------------------------------------------
    def _together(self, results: dict[str, Any], order: list[str], predictions: dict[str, dict[str, Any]]) -> None:
        together = together_set(results)
        if len(together) < 2:
            return
        neutral = [name for name in together if name in results and not results[name].get("pays_off")]
        per_sample = any(name.startswith("batch-size=") for name in together)
        self.announce(f"[together] the changes that paid alone, re-run as one set: {', '.join(together)}")
        pool, why = self.measure("together", together, self.baseline, per_sample=per_sample,
                                 label=" + ".join(together))
        combined: dict[str, Any] = {"changes": together, "measure": "re-run", "stopped": why,
                                    "runs": len(pool.runs), "added": [], "neutral_alone": neutral}
        results["combined"] = combined
        base, rates = self.baseline.times(per_sample), pool.times(per_sample)
        unit, rate_key = ("samples/s", "samples_per_s") if per_sample else ("steps/s", "steps_per_s")
        combined["unit"] = unit
        if why == "budget" and not pool.runs:
            combined["not_measured"] = "budget"
            return
        failed = [r for r in pool.runs if "error" in r]
        fallback = _without_riskiest(together)
        if failed and fallback and len(fallback) >= 2:
            # The set failed although each change ran alone: the compiled changes interact
            # most (the attention rewrite inside Inductor's graph). Once more without one.
            self.announce(f"  together ({', '.join(together)}) failed: {failed[0]['error']}; "
                          f"trying {', '.join(fallback)}")
            combined["failed_set"] = {"changes": together, "error": failed[0]["error"]}
            together = fallback
            combined["changes"] = together
            pool, why = self.measure("together", together, self.baseline, per_sample=per_sample,
                                     label=" + ".join(together))
            combined.update({"stopped": why, "runs": len(pool.runs)})
            rates = pool.times(per_sample)
            failed = [r for r in pool.runs if "error" in r]
        if failed or not rates or not base:
            combined["error"] = failed[0]["error"] if failed else "no step timed"
            return
        verdict = speedup_verdict(base, rates)
        combined.update({rate_key: 1 / statistics.median(rates), "speedup": verdict["speedup"],
                         "noise": verdict["noise"], "pays_off": verdict["pays_off"], "base_s": verdict["base_s"],
                         "variant_s": verdict["variant_s"], "over": "baseline"})
        self.announce(f"  together ({', '.join(together)}): {verdict['speedup']:.2f}× the baseline")
        extra = [name for name in combine.additions(results, tuple(order), together, self.device)
                 if not (name == "compile" and "cuda-graphs" in together)]
        extra.sort(key=lambda name: -((predictions.get(name) or {}).get("bound") or 1.0))  # most promising first
        for name in extra:
            changes = combine.with_added(together, [name])
            added_pool, added_why = self.measure(f"+{name}", changes, pool, per_sample=per_sample,
                                                 label=" + ".join(changes))
            if added_why == "budget" and not added_pool.runs:
                combined["added"].append({"added": [name], "not_measured": "budget",
                                          "predicted": predictions.get(name)})
                continue
            added_rates = added_pool.times(per_sample)
            failed = [r for r in added_pool.runs if "error" in r]
            if failed or not added_rates:
                combined["added"].append({"added": [name], "error": failed[0]["error"] if failed else "not timed"})
                continue
            added = speedup_verdict(pool.times(per_sample), added_rates)
            added.update({"added": [name], "changes": changes, rate_key: 1 / statistics.median(added_rates),
                          "unit": unit, "over": together, "runs": len(added_rates),
                          "over_baseline": statistics.median(base) / statistics.median(added_rates)})
            combined["added"].append(added)
        paying = [v for v in combined["added"] if v.get("pays_off")]
        combined["best_added"] = max(paying, key=lambda v: v["speedup"]) if paying else None


def together_set(results: dict[str, Any]) -> list[str]:
    """The changes re-run together: those that paid alone, and those that neither paid nor
    lost alone (speed-up within the noise, loss unchanged). Changes that bound different parts
    of the step pay only together: a host-bound optimizer step (a loop over the parameters)
    costs nothing while the GPU is the bottleneck, and half the step once mixed precision made
    the GPU work fast — measured alone, fused AdamW gains nothing there."""
    chosen = combine.paying_set(results)
    for name in combine.COMBINABLE:
        outcome = results.get(name) or {}
        if name in chosen or "speedup" not in outcome or not outcome.get("loss_ok", True):
            continue
        if outcome["speedup"] >= 1.0 - max(outcome.get("noise") or 0.0, GAIN_FLOOR):
            chosen.append(name)
    if "compile" in chosen and "cuda-graphs" in chosen:
        chosen.remove("compile")  # reduce-overhead is torch.compile too: one compile, with graphs
    batch = [c for c in chosen if c.startswith("batch-size=")]
    return [c for c in combine.COMBINABLE if c in chosen] + batch


def best_point(trials: dict[str, Any]) -> dict[str, Any] | None:
    """The best measured configuration against the baseline: the paying set together (plus the
    best change that paid on top of it), or the best single change when the set did not beat it.
    ``{"changes", "speedup", "measured_as"}``; None when nothing paid. A change timed in this
    process (``measure: "captured batch"``, compute on copies) is a candidate alone only when no
    set was re-run: its ratio is not comparable with a re-run's, and the set it joined measured
    it end to end."""
    combined = trials.get("combined") or {}
    singles = [(name, t) for name, t in trials.items()
               if name in combine.COMBINABLE and isinstance(t, dict) and t.get("pays_off") and "speedup" in t
               and not (t.get("measure") == "captured batch" and combined.get("speedup"))]
    candidates = [{"changes": [name], "speedup": t["speedup"],
                   "measured_as": ("alone, on the captured batch in this process, interleaved with your step"
                                   if t.get("measure") == "captured batch" else "alone, against the baseline")}
                  for name, t in singles]
    batch = trials.get("batch-size") or {}
    if batch.get("pays_off") and batch.get("best", {}).get("factor", 1) > 1:
        candidates.append({"changes": [f"batch-size={batch['best']['factor']}"], "speedup": batch["speedup"],
                           "measured_as": "alone, against the baseline (samples/s)"})
    if combined.get("speedup") and combined.get("pays_off"):
        candidates.append({"changes": combined["changes"], "speedup": combined["speedup"],
                           "measured_as": "together, interleaved with the baseline"})
        best_added = combined.get("best_added") or {}
        if best_added.get("over_baseline"):
            candidates.append({"changes": best_added["changes"], "speedup": best_added["over_baseline"],
                               "measured_as": "together, interleaved with the set it was added to"})
    if not candidates:
        return None
    return max(candidates, key=lambda c: c["speedup"])


def _without_riskiest(changes: list[str]) -> list[str] | None:
    """The set without the change most likely to break it in combination: SDPA's rewrite when
    it shares a compilation with compile / cuda-graphs, else the compilation itself."""
    compiled = [c for c in changes if c in ("compile", "cuda-graphs")]
    if "sdpa" in changes and compiled:
        return [c for c in changes if c != "sdpa"]
    if compiled:
        return [c for c in changes if c not in compiled]
    return None


def _label(changes: list[str]) -> str:
    return " + ".join(changes) if changes else "baseline (no change)"


def _ms(seconds: float, unit: str) -> str:
    return f"{1000 * seconds:.2f} ms/{unit}" if unit == "sample" else f"{1000 * seconds:.1f} ms/{unit}"


class CompileCache:
    """A run-private inductor cache shared by the re-runs (removed at the end)."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="nndoctor-inductor-")

    @property
    def env(self) -> dict[str, str]:
        return {"TORCHINDUCTOR_CACHE_DIR": self.folder, "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
                "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def measure_alone_command(target: Any) -> Callable[[str], str]:
    """The command that measures one change alone on the user's script."""
    def command(name: str) -> str:
        words = ["nndoctor", "perf", "--try", name]
        words += ["-m", target.name] if target.is_module else [target.name]
        return shlex.join([*words, *target.args])

    return command
