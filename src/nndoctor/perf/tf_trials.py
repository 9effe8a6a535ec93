"""``nndoctor perf`` on Keras/TensorFlow after the script stopped: the measured window as a
``PerfResult`` and the ``--try`` re-runs (``prefetch``, ``parallel-map``, ``mixed-precision``).

The re-runs are ``rerun.try_changes``'s, with ``tf_rerun_child`` as the child: the baseline and
each change interleaved ``--try-repeats`` times, medians, noise and the loss-change check.
A PyTorch-only change asked of a TensorFlow script is answered with why it does not apply.
"""

from __future__ import annotations

from typing import Any

from nndoctor.perf.recorder import LoopFacts
from nndoctor.perf.tf_diagnosis import tf_breakdown
from nndoctor.perf.tf_inject import TF_CHANGES
from nndoctor.perf.trials import TORCH_EQUIVALENTS

TF_CHILD = "nndoctor.perf.tf_rerun_child"


def split_tries(tries: tuple[str, ...], try_all: bool) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(the TensorFlow changes to measure, the answers for the others)."""
    wanted: list[str] = []
    answers: dict[str, Any] = {}
    for name in tries:
        if name in TF_CHANGES:
            wanted.append(name)
        elif name == "amp":
            wanted.append("mixed-precision")  # PyTorch's autocast is Keras's mixed-precision policy
        elif not try_all:
            hint = TORCH_EQUIVALENTS.get(name)
            answers[name] = {"skipped": f"--try {name} is a PyTorch change and this script trains with "
                                        f"Keras/TensorFlow" + (f"; {hint}" if hint else "")
                                        + f" (TensorFlow changes: {', '.join(TF_CHANGES)})"}
    return tuple(dict.fromkeys(wanted)), answers


def tensorflow_result(run: Any, session: Any) -> Any:
    from nndoctor.perf import rerun
    from nndoctor.perf.session import DeviceInfo, PerfResult

    recorder = run.tf_recorder
    config = run.config
    facts = recorder.facts
    device = DeviceInfo(name=facts.gpus[0] if facts.gpus else "cpu")
    trials: dict[str, Any] = {}
    wanted, answers = split_tries(config.tries, getattr(config, "try_all", False))
    trials.update(answers)
    if wanted and recorder.records:
        run.announce(f"re-running the script with {', '.join(wanted)} injected, against the baseline "
                     f"({config.try_repeats}× each, interleaved)")
        try:
            trials.update(rerun.try_changes(run.target, wanted, warmup=config.warmup, steps=config.steps,
                                            repeats=config.try_repeats, cwd=run.cwd,
                                            device="gpu" if facts.gpus else "cpu", child=TF_CHILD))
        except Exception as error:  # noqa: BLE001 - observer rule: the breakdown is still reported
            session.internal_error("perf --try (tensorflow)", error)
    elif wanted:
        for name in wanted:
            trials[name] = {"skipped": f"the script ran {recorder.steps_seen} optimizer steps, fewer than the "
                                       f"{config.warmup} + 2 a timed window needs"}
    return PerfResult(config=config, breakdown=tf_breakdown(recorder.records), facts=LoopFacts(), device=device,
                      trials=trials, steps_run=session.step, framework="tensorflow", tf_facts=facts)
