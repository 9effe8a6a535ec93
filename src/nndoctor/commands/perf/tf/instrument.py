"""``nndoctor perf`` on TensorFlow 2 / Keras 3: the step clock (input wait vs compute).

Steps are the ones the Keras/TF instrumentation already counts (``fit``'s callback,
``apply_gradients`` in custom loops, eager or inside ``tf.function``): the perf session hears
each one through ``PerfSession.count_step`` (``TfBackend.step_counted``) and the ``TfStepRecorder``
closes a step there.
The input wait is the time spent in the ``tf.data`` iterator's ``__next__`` since the last
step. Keras's compiled train function fetches its batch inside the graph, where nothing can
be timed, so in a perf session (only there) it is given the batch fetched eagerly instead —
Keras's own per-batch path, the same compiled ``train_step`` on the same batch.

Nothing here imports TensorFlow or torch at import time; the patches are applied once the
script imports TensorFlow and undone with the session.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nndoctor.commands.perf.timeline import StepRecord
from nndoctor.core.findings import Location
from nndoctor.core.stash import StashKey
from nndoctor.core.user_code import user_location
from nndoctor.tfdata.hooks import when_imported

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol

TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"


@dataclass
class TfFacts:
    """What the TF step clock learned about the loop (plain values only)."""

    iterated_at: Location | None = None  # the user's line that iterated the dataset (fit, a for loop)
    fit: bool = False  # steps came from Keras fit's train function
    steps_per_execution: int = 1
    gpus: list[str] = field(default_factory=list)
    policy: str = ""  # keras.mixed_precision global policy at the end of the window
    notes: list[str] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)  # input wait of each measured step (seconds)
    fetches: int = 0  # tf.data fetches timed inside the measured window
    backend: str = ""  # keras.config.backend()


class TfStepRecorder:
    """Per-step input wait and wall time of a TensorFlow training loop."""

    def __init__(self, warmup: int, last_step: int) -> None:
        self.warmup, self.last_step = warmup, last_step
        self.records: list[StepRecord] = []
        self.facts = TfFacts()
        self.steps_seen = 0
        self.active = False  # TensorFlow was imported and patched
        self._wait = 0.0
        self._samples = 0
        self._last: float | None = None

    def measuring(self) -> bool:
        return self.warmup <= self.steps_seen < self.last_step

    def fetched(self, seconds: float, element: Any) -> None:
        if self.measuring():
            self.facts.fetches += 1
        self._wait += seconds
        self._samples += _batch_size(element)

    def step_counted(self, step: int) -> None:
        now = time.perf_counter()
        self.steps_seen = step
        if self._last is not None and self.warmup < step <= self.last_step:
            wall = now - self._last
            wait = min(self._wait, wall)
            record = StepRecord(step=step, wall=wall, phases={"data": wait, "compute": wall - wait},
                                samples=self._samples)
            self.records.append(record)
            self.facts.waits.append(wait)
        self._last = now
        self._wait, self._samples = 0.0, 0


def _batch_size(element: Any) -> int:
    """The leading dimension of the first tensor of an element (0 when there is none)."""
    first = element
    while isinstance(first, (tuple, list)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    try:
        return int(shape[0]) if shape is not None and len(shape) else 0
    except (TypeError, ValueError, IndexError):
        return 0


# The step recorder of a perf session, where ``install`` finds it (perf/tf/backend.py puts it there).
TF_STEP_RECORDER = StashKey[TfStepRecorder]("perf: the Keras/TensorFlow step recorder")


class TfPerfPatches:
    def __init__(self, installation: InstallationProtocol, recorder: TfStepRecorder) -> None:
        self.installation = installation
        self.session = installation.session
        self.recorder = recorder

    def live(self) -> bool:
        """Before the end of the window (the trials re-run the script: nothing to time after it)."""
        return self.recorder.steps_seen < self.recorder.last_step

    def patch_tensorflow(self, tf: Any) -> None:
        from tensorflow.python.data.ops import dataset_ops, iterator_ops

        patcher = self.installation.patcher
        recorder = self.recorder
        recorder.active = True
        original_next = patcher.patch(iterator_ops.OwnedIterator, "__next__", None)
        clock = time.perf_counter

        def __next__(iterator):
            if not self.live() or not tf.executing_eagerly():
                return original_next(iterator)
            start = clock()
            element = original_next(iterator)  # StopIteration ends the epoch as usual
            recorder.fetched(clock() - start, element)
            return element

        __next__.__wrapped__ = original_next  # type: ignore[attr-defined]
        patcher.patch(iterator_ops.OwnedIterator, "__next__", __next__)
        original_iter = patcher.patch(dataset_ops.DatasetV2, "__iter__", None)

        def __iter__(dataset):
            if recorder.facts.iterated_at is None and tf.executing_eagerly():
                self._guard(lambda: setattr(recorder.facts, "iterated_at", user_location(sys._getframe(2))))
            return original_iter(dataset)

        __iter__.__wrapped__ = original_iter  # type: ignore[attr-defined]
        patcher.patch(dataset_ops.DatasetV2, "__iter__", __iter__)
        patcher.on_undo(lambda: self._guard(lambda: self._conclude(tf)))
        when_imported(TRAINER_MODULE, lambda module: self._guard(lambda: self.patch_trainer(module, iterator_ops)),
                      patcher)

    def patch_trainer(self, module: Any, iterator_ops: Any) -> None:
        trainer = getattr(module, "TensorFlowTrainer", None)
        if trainer is None:
            return
        patcher = self.installation.patcher
        original = patcher.patch(trainer, "make_train_function", None)
        patches = self

        def make_train_function(model, force=False):
            result = original(model, force)
            function = getattr(model, "train_function", None)
            if function is not None and not getattr(function, "_nndoctor_perf_fetch", False):
                model.train_function = _eager_fetch(function, model, patches, iterator_ops.OwnedIterator)
                return model.train_function if result is function else result
            return result

        make_train_function.__wrapped__ = original  # type: ignore[attr-defined]
        patcher.patch(trainer, "make_train_function", make_train_function)

    def _conclude(self, tf: Any) -> None:
        facts = self.recorder.facts
        facts.gpus = [device.name for device in tf.config.list_logical_devices("GPU")]
        keras = sys.modules.get("keras")
        if keras is not None and hasattr(keras, "mixed_precision"):
            facts.policy = str(keras.mixed_precision.global_policy().name)
            facts.backend = str(keras.config.backend())

    def _guard(self, action: Any) -> None:
        try:
            action()
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("perf tensorflow instrumentation", error)


def _eager_fetch(function: Any, model: Any, patches: TfPerfPatches, owned_iterator: type) -> Any:
    """Keras's train function, given each batch fetched eagerly (timed by the ``__next__`` patch)."""

    def train_function(iterator):
        if not isinstance(iterator, owned_iterator) or not patches.live():
            return function(iterator)
        facts = patches.recorder.facts
        facts.fit = True
        per_call = int(getattr(model, "steps_per_execution", 1) or 1)
        if per_call != 1:
            facts.steps_per_execution = per_call  # several steps per graph call: the wait is inside it
            return function(iterator)
        element = next(iterator)  # StopIteration ends the epoch, as Keras's own fetch would
        return function(iter((element,)))  # a Python iterator takes Keras's per-batch path

    train_function._nndoctor_perf_fetch = True  # type: ignore[attr-defined]
    train_function.__wrapped__ = function  # type: ignore[attr-defined]
    return train_function


def install(installation: InstallationProtocol) -> None:
    recorder = installation.session.stash.get(TF_STEP_RECORDER, None)  # only a perf session has one
    if recorder is None:
        return
    patches = TfPerfPatches(installation, recorder)
    when_imported("tensorflow", lambda tf: patches._guard(lambda: patches.patch_tensorflow(tf)), installation.patcher)
