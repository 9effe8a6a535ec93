"""``--try`` on TensorFlow: the changes injected into a re-run of the user's unchanged script,
and the clock that times its steps (``python -m nndoctor.commands.perf.tf.rerun_child``).

* ``prefetch``: a dataset iterated eagerly (``fit``'s epoch iterator, a ``for`` loop) whose
  last stage is not a prefetch is iterated as ``dataset.prefetch(tf.data.AUTOTUNE)``;
* ``parallel-map``: ``Dataset.map`` called without ``num_parallel_calls`` gets
  ``num_parallel_calls=tf.data.AUTOTUNE`` (order stays deterministic: same batches);
* ``mixed-precision``: ``keras.mixed_precision.set_global_policy`` right after the script
  imports Keras, before any layer is built: ``mixed_float16`` on a GPU, ``mixed_bfloat16``
  on the CPU.

Each applied change names the user's line it acted on. Nothing here imports torch.
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any

from nndoctor.core.engine import Session
from nndoctor.core.user_code import is_own_file, is_user_code, user_location
from nndoctor.tfdata.hooks import when_imported
from nndoctor.tfdata.pipeline import read_pipeline

TF_CHANGES = ("prefetch", "parallel-map", "mixed-precision")
_STAGES = ("map", "batch", "padded_batch", "shuffle", "cache", "repeat", "filter", "interleave", "unbatch", "take")


def mixed_policy(gpus: list[Any]) -> str:
    """float16 with loss scaling where GPUs have fast fp16; bfloat16 on the CPU (no loss scaling)."""
    return "mixed_float16" if gpus else "mixed_bfloat16"


class TfChangeInjector:
    """Applies the ``--try`` changes once TensorFlow / Keras are imported (undone at run end)."""

    subscriber_name = "perf --try tensorflow change injector"

    def __init__(self, changes: Any) -> None:
        self.changes = frozenset(changes)
        self.applied: list[str] = []
        self.notes: list[str] = []
        self._undo: list[Any] = []
        self._hooks: list[Any] = []
        self.locations: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.loss: Any = None  # the last step's loss (a tensor or number, read only outside the window)
        self._when("tensorflow", self._patch_tensorflow)  # the loss readers, whatever the change
        self._when("keras.src.dtype_policies.dtype_policy", self._patch_policy)
        self._when("keras.src.callbacks.callback_list", self._patch_callbacks)

    def _when(self, name: str, then: Any) -> None:
        injector = self

        class _Patcher:  # when_imported's patcher protocol: undo actions
            @staticmethod
            def on_undo(action: Any) -> None:
                injector._undo.append(action)

        when_imported(name, then, _Patcher)

    def _patch(self, owner: Any, name: str, make: Any) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def _note_applied(self, text: str) -> None:
        if text not in self.applied:
            self.applied.append(text)

    # -- TensorFlow ------------------------------------------------------------------------
    def _patch_tensorflow(self, tf: Any) -> None:
        from tensorflow.python.data.ops import dataset_ops
        from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

        dataset_cls = dataset_ops.DatasetV2
        for stage in _STAGES:
            if stage in dataset_cls.__dict__:
                self._patch(dataset_cls, stage, self._stage_recorder(stage))
        if "prefetch" in self.changes:
            self._patch(dataset_cls, "__iter__", self._prefetching_iter(tf))
        self._patch(tf.GradientTape, "gradient", self._loss_reader_tape)
        self._patch(Function, "__call__", self._loss_reader_function)

    def _stage_recorder(self, stage: str) -> Any:
        injector = self

        def make(original: Any) -> Any:
            def stage_call(dataset, *args, **kwargs):
                caller = sys._getframe(1)
                where = user_location(caller)
                if stage == "map" and "parallel-map" in injector.changes and where is not None \
                        and len(args) < 2 and kwargs.get("num_parallel_calls") is None:
                    import tensorflow as tf

                    kwargs["num_parallel_calls"] = tf.data.AUTOTUNE
                    whose = "the map" if _called_by_user(caller) else "a map Keras builds for the call"
                    injector._note_applied(f"num_parallel_calls=tf.data.AUTOTUNE on {whose} at {where}")
                result = original(dataset, *args, **kwargs)
                if where is not None:
                    injector.locations[result] = where
                return result

            stage_call.__wrapped__ = original  # type: ignore[attr-defined]
            return stage_call

        return make

    def _prefetching_iter(self, tf: Any) -> Any:
        injector = self

        def make(original: Any) -> Any:
            def __iter__(dataset):
                if not tf.executing_eagerly():
                    return original(dataset)
                pipeline = read_pipeline(dataset, injector.locations)
                if pipeline.prefetched():
                    return original(dataset)
                last = next((s for s in pipeline.stages if s.location is not None), None)
                after = f"after the {last.kind} at {last.location}" if last else "at the end of the pipeline"
                injector._note_applied(f".prefetch(tf.data.AUTOTUNE) {after}")
                return original(dataset.prefetch(tf.data.AUTOTUNE))

            __iter__.__wrapped__ = original  # type: ignore[attr-defined]
            return __iter__

        return make

    # -- the loss, for the loss-change check -------------------------------------------------
    def _loss_reader_tape(self, original: Any) -> Any:
        injector = self

        def gradient(tape, target, *args, **kwargs):
            if _scalar_float(target) and _eager(target):
                injector.loss = target
            return original(tape, target, *args, **kwargs)

        gradient.__wrapped__ = original  # type: ignore[attr-defined]
        return gradient

    def _loss_reader_function(self, original: Any) -> Any:
        injector = self

        def __call__(function, *args, **kwargs):
            result = original(function, *args, **kwargs)
            first = result[0] if isinstance(result, (tuple, list)) and result else result
            if isinstance(result, dict):
                first = result.get("loss")
            if _scalar_float(first) and _eager(first):
                injector.loss = first  # a compiled train step returning its loss
            return result

        __call__.__wrapped__ = original  # type: ignore[attr-defined]
        return __call__

    # -- Keras -------------------------------------------------------------------------------
    # Hooked on Keras's own submodules, not on ``keras``: nndoctor's Keras instrumentation
    # already waits for ``import keras``, and two import hooks on one name would wrap each other.
    def _patch_policy(self, module: Any) -> None:
        if "mixed-precision" not in self.changes:
            return
        import tensorflow as tf

        policy = mixed_policy(tf.config.list_physical_devices("GPU"))
        before = module.dtype_policy().name
        module.set_dtype_policy(policy)
        self._undo.append(lambda: module.set_dtype_policy(before))
        self._note_applied(f"keras.mixed_precision.set_global_policy({policy!r}) before the model is built "
                           f"(was {before!r})")

    def _patch_callbacks(self, module: Any) -> None:
        injector = self

        def make(original: Any) -> Any:
            def on_train_batch_end(callbacks, batch, logs=None):
                if isinstance(logs, dict) and logs.get("loss") is not None:
                    injector.loss = logs["loss"]  # read after the window only
                return original(callbacks, batch, logs)

            on_train_batch_end.__wrapped__ = original  # type: ignore[attr-defined]
            return on_train_batch_end

        self._patch(module.CallbackList, "on_train_batch_end", make)

    def on_run_end(self, event: Any) -> None:
        while self._undo:
            self._undo.pop()()


def _called_by_user(frame: Any) -> bool:
    """Is the first frame outside nndoctor (another patch may wrap the same method) the user's?"""
    while frame is not None and is_own_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame is not None and is_user_code(frame.f_code)


def _scalar_float(value: Any) -> bool:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    return shape is not None and len(shape) == 0 and bool(getattr(dtype, "is_floating", False))


def _eager(value: Any) -> bool:
    return hasattr(value, "numpy") and type(value).__name__ == "EagerTensor"


def _float(value: Any) -> float | None:
    try:
        return float(value.numpy() if hasattr(value, "numpy") else value)
    except (TypeError, ValueError):
        return None


class TfStepClock:
    """Times steps ``warmup+1 … warmup+steps`` (the steps Keras/TF instrumentation counts)."""

    def __init__(self, injector: TfChangeInjector, warmup: int, steps: int) -> None:
        self.injector = injector
        self.warmup, self.steps = warmup, steps
        self.count = 0
        self.started: float | None = None
        self.seconds_per_step: float | None = None
        self.first_loss: float | None = None
        self.final_loss: float | None = None

    def step_counted(self) -> None:
        self.count += 1
        if self.count == 1:
            self.first_loss = _float(self.injector.loss)
        if self.count == self.warmup:
            self.started = time.perf_counter()
        elif self.count == self.warmup + self.steps and self.started is not None:
            self.seconds_per_step = (time.perf_counter() - self.started) / self.steps
            self.final_loss = _float(self.injector.loss)  # outside the window: a sync is fine here


class TfRerunSession(Session):
    """The re-run's session: Keras/TF steps arrive through ``count_step`` only (no step events).

    The re-run times the Keras/TF steps of a run whose steps all came from Keras/TF (the perf
    ``TfBackend`` measured it), with no check enabled: PyTorch's hooks would only cost the re-run the
    torch import (about 3 s of CPU on a 2-core machine, paid by every re-run)."""

    instruments_torch = False

    clock: TfStepClock | None = None

    def count_step(self, optimizer: Any) -> None:
        super().count_step(optimizer)
        if self.clock is not None:
            self.clock.step_counted()
