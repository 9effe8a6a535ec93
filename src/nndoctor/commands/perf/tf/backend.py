"""The Keras/TensorFlow perf backend: the step clock (``perf/tf/instrument.py``, installed once the
script imports TensorFlow), the ``--try`` re-runs after the script, and the window's result.

Keras/TF steps reach the session only as counted steps (no step events): ``step_counted`` closes
a step of the clock. Nothing here imports TensorFlow or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nndoctor.commands.perf.backend import Diagnosis, PerfRun
from nndoctor.commands.perf.config import PerfConfig
from nndoctor.commands.perf.tf.instrument import TF_STEP_RECORDER, TfFacts, TfStepRecorder
from nndoctor.commands.perf.timeline import Breakdown

if TYPE_CHECKING:
    from nndoctor.core.engine import Session


@dataclass
class TfPerfResult:
    """A measured Keras/TensorFlow window: input wait vs compute per step, and the ``--try`` re-runs."""

    config: PerfConfig
    breakdown: Breakdown
    facts: TfFacts
    device_name: str
    trials: dict[str, Any]
    steps_run: int

    def to_json(self) -> dict[str, Any]:
        from nndoctor.commands.perf.tf.diagnosis import tf_json

        return tf_json(self)

    def diagnose(self) -> Diagnosis:
        from nndoctor.commands.perf.tf.diagnosis import (
            classify_tf,
            median_wait_s,
            tf_advice,
            tf_diagnose,
        )

        # The perf window's own measurement of the input wait replaces the run-time K106 estimate.
        return Diagnosis(tf_diagnose(self), classify_tf(self.breakdown, median_wait_s(self), self.facts.fetches),
                         tf_advice(self), replaces=frozenset({"K106"}))


class TfBackend:
    """``PerfBackend`` for Keras/TensorFlow: its step recorder is stashed under ``TF_STEP_RECORDER``
    for ``perf/tf/instrument.py``, which starts it once the script imports TensorFlow."""

    def __init__(self, run: PerfRun) -> None:
        self.run = run
        self.recorder: TfStepRecorder | None = None

    def instrument(self, session: Session) -> None:
        config = self.run.config
        self.recorder = session.stash[TF_STEP_RECORDER] = TfStepRecorder(config.warmup, config.last_step)

    def step_counted(self, step: int) -> None:
        recorder = self.recorder
        if recorder is not None and recorder.active:
            recorder.step_counted(step)  # the TF step clock closes a step

    def timed_steps(self) -> bool:
        recorder = self.recorder
        return bool(recorder is not None and recorder.active and recorder.steps_seen)

    def measure(self, session: Session) -> TfPerfResult:
        from nndoctor.commands.perf.tf.diagnosis import tf_breakdown
        from nndoctor.commands.perf.tf.trials import tensorflow_trials

        recorder = self.recorder
        if recorder is None:  # instrument() builds it before the script runs
            raise RuntimeError("the TensorFlow step recorder was never built")
        facts = recorder.facts
        return TfPerfResult(config=self.run.config, breakdown=tf_breakdown(recorder.records), facts=facts,
                            device_name=facts.gpus[0] if facts.gpus else "cpu",
                            trials=tensorflow_trials(self.run, recorder, session), steps_run=session.step)

