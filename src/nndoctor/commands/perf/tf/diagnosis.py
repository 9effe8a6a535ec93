"""``nndoctor perf`` on Keras/TensorFlow: the breakdown (input wait vs compute), the step class,
the findings and the advice, from a finished ``TfPerfResult`` (``perf/tf/backend.py``).

The JSON has the keys of the PyTorch perf (``window``, ``breakdown`` with ``phases_s`` and
``fractions``, ``device``, ``trials``, ``step_class``, ``advice``) plus ``framework`` and
``input``; the phases are ``data`` (time in the ``tf.data`` iterator) and ``compute`` (the rest
of the step). An input-bound window is reported as K106 with the measured ``--try`` results;
a measured mixed-precision gain on a GPU as P105. Nothing here imports TensorFlow or torch.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from nndoctor.commands.perf.classify import INPUT_BOUND
from nndoctor.commands.perf.detection import data_bound, trial_outcome
from nndoctor.commands.perf.measured_checks import NoMixedPrecision
from nndoctor.commands.perf.timeline import Breakdown, StepRecord
from nndoctor.core.findings import Finding, Severity
from nndoctor.tfdata.checks import MIN_MEDIAN_WAIT_MS, TfDataInputBound

if TYPE_CHECKING:
    from nndoctor.commands.perf.tf.backend import TfPerfResult

INPUT_CHANGES = ("prefetch", "parallel-map")


def tf_breakdown(records: list[StepRecord]) -> Breakdown:
    phases = {"data": sum(r.phases["data"] for r in records), "compute": sum(r.phases["compute"] for r in records)}
    return Breakdown(steps=len(records), wall=sum(r.wall for r in records), phases=phases, syncs=0,
                     samples=sum(r.samples for r in records), step_times=[r.wall for r in records],
                     gpu_busy=None, gpu_wall=None)


def median_wait_s(result: TfPerfResult) -> float:
    """The median step's input wait: a few slow fetches (an epoch's first) do not make a pipeline slow."""
    waits = result.facts.waits
    return statistics.median(waits) if waits else 0.0


def classify_tf(breakdown: Breakdown, median_wait: float, fetches: int = 1) -> dict[str, Any]:
    if not fetches:
        return {"class": "input-unmeasured",
                "reason": "no tf.data fetch was timed in the window (batches not from a tf.data iterator, e.g. "
                          "Keras fit on the torch backend): the whole step counts as compute"}
    share = breakdown.fraction("data")
    if share >= INPUT_BOUND and 1000 * median_wait >= MIN_MEDIAN_WAIT_MS:
        return {"class": "input-bound",
                "reason": f"the step waits for its tf.data input {share:.0%} of the time "
                          f"(median {1000 * median_wait:.1f} ms a step): the pipeline first (prefetch, parallel map)"}
    return {"class": "compute-bound",
            "reason": f"the input arrives in time (waiting {share:.0%} of the step): the step's own computation "
                      "bounds it (mixed precision on a GPU, a larger batch, XLA)"}


def tf_json(result: TfPerfResult) -> dict[str, Any]:
    facts = result.facts
    return {
        "framework": "tensorflow",
        "window": {"warmup": result.config.warmup, "steps": result.config.steps, "measured": result.breakdown.steps},
        "breakdown": result.breakdown.to_json(),
        "device": {"name": result.device_name, "capability": None, "other_processes": [], "nvml": "not used"},
        "peak_memory_bytes": None,
        "kernel_timeline": None,
        "loader": {},
        "syncs": {"by_kind": {}, "by_location": {}},
        "input": {"median_wait_s": median_wait_s(result),
                  "iterated_at": str(facts.iterated_at) if facts.iterated_at else None,
                  "fit": facts.fit, "steps_per_execution": facts.steps_per_execution,
                  "dtype_policy": facts.policy, "gpus": facts.gpus, "fetches": facts.fetches,
                  "keras_backend": facts.backend},
        "trials": result.trials,
    }


def _applied(trials: dict[str, Any], name: str) -> list[str]:
    return list((trials.get(name) or {}).get("applied") or [])


def _measured(trials: dict[str, Any], name: str) -> str:
    outcome = trial_outcome(trials, name)
    if outcome is not None:
        verdict = "pays off" if outcome.get("pays_off") else "no gain"
        where = "; ".join(_applied(trials, name))
        return (f"--try {name} {outcome['speedup']:.2f}× ({1000 * outcome['base_s']:.1f} → "
                f"{1000 * outcome['variant_s']:.1f} ms/step, noise {outcome['noise']:.1%}): {verdict}"
                + (f" [{where}]" if where else ""))
    tried = trials.get(name)
    if isinstance(tried, dict) and (tried.get("error") or tried.get("skipped")):
        return f"--try {name} could not measure it: {tried.get('error') or tried.get('skipped')}"
    return f"not measured: run nndoctor perf --try {name}"


def tf_diagnose(result: TfPerfResult) -> list[Finding]:
    b, facts, trials = result.breakdown, result.facts, result.trials
    findings: list[Finding] = []
    if not b.steps:
        return findings
    wait = median_wait_s(result)
    data = data_bound(b.phases["data"], b.wall)
    if data and 1000 * wait >= MIN_MEDIAN_WAIT_MS:
        message = (f"the training step waited for its tf.data input {data['data_wait_fraction']:.0%} of the time "
                   f"(median {1000 * wait:.1f} ms of a {1000 * b.median_step:.1f} ms step, {b.steps} steps measured "
                   f"by nndoctor perf): an input that kept up would make steps up to {data['max_speedup']:.2f}× "
                   f"faster (Amdahl bound); " + "; ".join(_measured(trials, n) for n in INPUT_CHANGES))
        paying = [n for n in INPUT_CHANGES if (trial_outcome(trials, n) or {}).get("pays_off")]
        fix = "; ".join(text for n in paying for text in _applied(trials, n))
        speedups = {f"speedup_{n}": round(o["speedup"], 3) for n in INPUT_CHANGES
                    if (o := trial_outcome(trials, n)) is not None}
        findings.append(TfDataInputBound.finding(
            message, location=facts.iterated_at, fix=f"measured to pay off: {fix}" if fix else None,
            evidence={**data, "median_wait_ms": round(1000 * wait, 3), "measured_by": "nndoctor perf", **speedups}))
    outcome = trial_outcome(trials, "mixed-precision")
    if facts.gpus and "mixed" not in facts.policy:
        if outcome is None or outcome.get("pays_off"):
            claim = f"float32 Keras training ({facts.policy or 'float32'} policy) on {result.device_name}"
            severity = Severity.WARNING if outcome else Severity.INFO
            findings.append(NoMixedPrecision.finding(
                f"{claim}; " + _measured(trials, "mixed-precision"), location=facts.iterated_at, severity=severity,
                fix='keras.mixed_precision.set_global_policy("mixed_float16") before building the model',
                evidence={"dtype_policy": facts.policy, "measured": outcome is not None}))
    return findings


def tf_advice(result: TfPerfResult) -> list[dict[str, Any]]:
    items = []
    for name in (*INPUT_CHANGES, "mixed-precision"):
        outcome = trial_outcome(result.trials, name)
        if outcome and outcome.get("pays_off"):
            items.append({"change": name, "measured_speedup": outcome["speedup"], "noise": outcome["noise"],
                          "applied": _applied(result.trials, name),
                          **({"loss_change": outcome.get("loss_change")} if name == "mixed-precision" else {})})
    return items
