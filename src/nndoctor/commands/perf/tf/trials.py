"""``nndoctor perf`` on Keras/TensorFlow after the script stopped: the ``--try`` re-runs (``prefetch``, ``parallel-map``, ``mixed-precision``).

The re-runs are ``rerun.try_changes``'s, with ``perf/tf/rerun_child.py`` as the child: the baseline and
each change interleaved ``--try-repeats`` times, medians, noise and the loss-change check.
A PyTorch-only change asked of a TensorFlow script is answered with why it does not apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nndoctor.commands.perf.tf.inject import TF_CHANGES
from nndoctor.commands.perf.trials import TORCH_EQUIVALENTS

if TYPE_CHECKING:
    from nndoctor.commands.perf.backend import PerfRun
    from nndoctor.commands.perf.tf.instrument import TfStepRecorder
    from nndoctor.core.engine import Session

TF_CHILD = "nndoctor.commands.perf.tf.rerun_child"


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


def tensorflow_trials(run: PerfRun, recorder: TfStepRecorder, session: Session) -> dict[str, Any]:
    """The ``--try`` results of a Keras/TensorFlow perf run (re-runs of the script)."""
    from nndoctor.commands.perf import rerun

    config = run.config
    gpus = recorder.facts.gpus
    wanted, trials = split_tries(config.tries, config.try_all)
    if wanted and recorder.records:
        run.announce(f"re-running the script with {', '.join(wanted)} injected, against the baseline "
                     f"({config.try_repeats}× each, interleaved)")
        try:
            trials.update(rerun.try_changes(run.target, wanted, warmup=config.warmup, steps=config.steps,
                                            repeats=config.try_repeats, cwd=run.cwd,
                                            device="gpu" if gpus else "cpu", child=TF_CHILD))
        except Exception as error:  # noqa: BLE001 - observer rule: the breakdown is still reported
            session.internal_error("perf --try (tensorflow)", error)
    elif wanted:
        for name in wanted:
            trials[name] = {"skipped": f"the script ran {recorder.steps_seen} optimizer steps, fewer than the "
                                       f"{config.warmup} + 2 a timed window needs"}
    return trials
