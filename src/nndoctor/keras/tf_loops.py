"""Zero-code-change instrumentation of TensorFlow 2 custom training loops (Keras 3, TF backend).

Patched when Keras is patched on the TensorFlow backend; every patch is undone at the end
of the run:

* ``BaseOptimizer.apply`` (``apply_gradients`` calls it): an eager call is one optimizer
  step (counted, ``--max-steps`` stops the run after it). Called while a ``tf.function`` is
  traced, it marks the outermost traced function as a training step, and each later call
  of that function counts one step. The variables it updates tie model calls to training.
* ``tf.GradientTape.__enter__/__exit__``: is a tape recording? ``tf.GradientTape.gradient``:
  its target is the loss; run eagerly, its value is read (one scalar) for N101 and L106,
  and a NaN/Inf loss has the batch of the model call under the tape run again through the
  layers before the optimizer updates them. That batch is held from the model call to the
  step's ``tape.gradient`` or optimizer step, no longer (the model weakly). Inside ``tf.function`` the target is
  symbolic and nothing is read (an extra reader in the graph can change the user's numbers).
* ``keras.layers.Layer.__call__`` (outermost calls from the user's code only): the
  ``training`` argument, for K105. Inside ``tf.function`` this runs while tracing, once per
  graph, which is enough: the flag is a Python value fixed in the graph.
* ``tf.function``'s ``Function.__call__``: calls and traces per function (K109) and the
  step counting above.

``fit``/``evaluate``/``predict`` are left to ``nndoctor.keras.instrument`` (its callback
counts their steps), except for the K105 facts of a user's own ``train_step``.
"""

from __future__ import annotations

import inspect
import os
import sys
import weakref
from typing import Any

from nndoctor.core.engine import StopRun
from nndoctor.instrument.wrapping import mark_wrapper
from nndoctor.keras.events import (
    FunctionTraced,
    GradientsApplied,
    KerasBatch,
    KerasModelCall,
    TrainLoss,
)
from nndoctor.keras.facts import ModelCall, TraceHistory
from nndoctor.keras.tf_location import called_from_user, tf_user_location

# Layers whose output depends on the training flag.
_MODE_LAYER_MARKERS = ("Dropout", "BatchNormalization", "GaussianNoise", "Random")
_PYTHON_SCALARS = (bool, int, float, str, type(None))


class LoopObserver:
    """Custom-loop facts for K105/K109 (emitted on the session as ``KerasModelCall`` and
    ``FunctionTraced`` events) and step counting of eager and tf.function steps."""

    def __init__(self, observer: Any, keras: Any) -> None:
        self.observer = observer
        self.session = observer.session
        self.keras = keras
        session = self.session
        self.tape_depth = 0
        self.layer_depth = 0
        self.apply_depth = 0
        self.functions: list[Any] = []  # tf.function calls in progress, outermost first
        # tf.function -> the optimizer its traced graph steps.
        self.step_functions: weakref.WeakKeyDictionary[Any, weakref.ref] = weakref.WeakKeyDictionary()
        self.histories: weakref.WeakKeyDictionary[Any, TraceHistory] = weakref.WeakKeyDictionary()
        self.signatures: weakref.WeakKeyDictionary[Any, inspect.Signature | None] = weakref.WeakKeyDictionary()
        self.mode_layers: weakref.WeakKeyDictionary[Any, tuple[str, ...]] = weakref.WeakKeyDictionary()
        self.trained: weakref.WeakSet[Any] = weakref.WeakSet()
        self.inputs_seen: weakref.WeakSet[Any] = weakref.WeakSet()  # models whose loop input D101 read
        # Model calls under the current tape, waiting for the optimizer step that shows what is trained.
        self.pending: list[tuple[weakref.ref, ModelCall]] = []
        # The last model called from the user's code under a tape (weakly) and its input, held
        # until the step's tape.gradient or optimizer step: N101 runs it again.
        self.last_input: tuple[weakref.ref, Any] | None = None
        self.optimizers: set[int] = set()  # optimizers stepped outside fit (L106 skips GANs)
        # Probes (``keras/probes.py``): the losses of a custom loop are read ("tape_losses"), and the
        # gradients it applies measured ("gradient_norms").
        self.reads_losses = False
        self.measure_gradients = False
        self._session_pid = session.pid

    @property
    def watching(self) -> bool:
        return self.observer.enabled and os.getpid() == self._session_pid

    @property
    def inside_fit(self) -> bool:
        return bool(self.observer.calls)

    # -- patches -------------------------------------------------------------------------
    def install(self) -> None:
        import tensorflow as tf
        from keras.src.optimizers.base_optimizer import BaseOptimizer
        from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

        patcher = self.observer.installation.patcher
        self._wrap(patcher, BaseOptimizer, "apply", self._apply)
        self._wrap(patcher, Function, "__call__", self._function_call)
        tape = tf.GradientTape
        original_enter = patcher.patch(tape, "__enter__", None)
        original_exit = patcher.patch(tape, "__exit__", None)

        def __enter__(tape_object):
            result = original_enter(tape_object)
            if self.tape_depth == 0:
                self.pending.clear()  # a new training step begins
            self.tape_depth += 1
            return result

        def __exit__(tape_object, *exc):
            self.tape_depth = max(0, self.tape_depth - 1)
            return original_exit(tape_object, *exc)

        patcher.patch(tape, "__enter__", __enter__)
        patcher.patch(tape, "__exit__", __exit__)

    def install_tape_losses(self) -> None:
        """Probe "tape_losses": the target of ``tape.gradient``, and the loss a compiled step returns."""
        import tensorflow as tf

        self.reads_losses = True
        self._wrap(self.observer.installation.patcher, tf.GradientTape, "gradient", self._gradient)

    def install_model_calls(self) -> None:
        """Probe "keras_model_calls": the user's outermost model calls (K105's flag, D101's first
        input under a tape, the batch N101 runs again)."""
        self._wrap(self.observer.installation.patcher, self.keras.layers.Layer, "__call__", self._layer_call)

    @staticmethod
    def _wrap(patcher: Any, owner: Any, name: str, around: Any) -> None:
        original = patcher.patch(owner, name, None)

        def wrapper(obj, *args, **kwargs):
            return around(original, obj, args, kwargs)

        mark_wrapper(wrapper, original)
        patcher.patch(owner, name, wrapper)

    # -- model calls (K105) ----------------------------------------------------------------
    def _layer_call(self, original: Any, layer: Any, args: tuple, kwargs: dict) -> Any:
        session = self.session
        flags = session.wants(KerasModelCall.kind)
        if self.layer_depth or not self.watching or not (
                flags or session.wants(KerasBatch.kind) or session.wants(TrainLoss.kind)):
            return original(layer, *args, **kwargs)
        self.layer_depth += 1
        try:
            if self.tape_depth and args and not self.inside_fit:
                self._remember_input(layer, args[0], sys._getframe(2))
                if layer not in self.inputs_seen:
                    self._inspect_input(layer, args[0], sys._getframe(2))
            if flags:
                self._record_call(layer, kwargs, sys._getframe(2))
            return original(layer, *args, **kwargs)
        finally:
            self.layer_depth -= 1

    def _record_call(self, layer: Any, kwargs: dict, caller: Any) -> None:
        try:
            if not called_from_user(caller):
                return  # Keras's own train/test step, or a layer inside a model
            training = kwargs.get("training")
            if training is not None and not isinstance(training, bool):
                return  # a tensor or symbolic flag: decided at run time
            mode_layers = self._mode_layers(layer)
            if not mode_layers:
                return
            call = ModelCall(layer.name, training, self.tape_depth > 0, tf_user_location(caller), mode_layers)
            if call.under_tape:
                self.pending.append((weakref.ref(layer), call))
            elif layer in self.trained:
                self._emit_call(call, 0)
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("keras model call", error)

    def _inspect_input(self, layer: Any, x: Any, caller: Any) -> None:
        """D101 on the first batch the user's code gives a model under a tape (eager values only)."""
        try:
            if not called_from_user(caller):
                return
            self.inputs_seen.add(layer)
            self.observer.inspect_loop_input(layer, x, tf_user_location(caller))
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("keras model input", error)

    def _remember_input(self, layer: Any, x: Any, caller: Any) -> None:
        try:
            if self.session.wants(TrainLoss.kind) and called_from_user(caller):
                self.last_input = (weakref.ref(layer), x)
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("keras model call", error)

    # -- the loss (N101, L106) ----------------------------------------------------------------
    def _gradient(self, original: Any, tape: Any, args: tuple, kwargs: dict) -> Any:
        if self.watching and not self.inside_fit and args:
            try:
                self._loss(args[0], sys._getframe(2))
            except Exception as error:  # noqa: BLE001 - observer rule
                self.session.internal_error("keras loop loss", error)
        self.last_input = None
        return original(tape, *args, **kwargs)

    def _loss(self, target: Any, caller: Any, *, compiled: bool = False) -> None:
        """One training step's scalar loss for L106's series and N101: the target of
        ``tape.gradient`` in an eager step, or (``compiled``) the scalar a ``tf.function`` training
        step returned, read after the call."""
        import math

        import tensorflow as tf

        if not tf.executing_eagerly() or not isinstance(target, tf.Tensor) or target.shape.rank != 0 \
                or not target.dtype.is_floating:
            return  # traced (tf.function), or not one scalar loss
        if "CPU" not in str(target.device).upper() and not self.session.is_sampled(self.session.step):
            return  # reading an accelerator's loss waits for the step: sampled steps only
        location = tf_user_location(caller)
        value = float(target.numpy())
        step = self.session.step
        model, x = (None, None)
        if not math.isfinite(value) and self.last_input and not compiled:
            model, x = self.last_input[0](), self.last_input[1]  # N101 runs that batch again
        self.session.emit(TrainLoss(
            step=step, sampled=True, value=value, series=("loop", location), where="the training loop",
            called_at=location, model=model, inputs=x, exact=True, compiled=compiled, in_fit=False,
            optimizers=frozenset(self.optimizers)))

    def _mode_layers(self, layer: Any) -> tuple[str, ...]:
        cached = self.mode_layers.get(layer)
        if cached is None:
            flatten = getattr(layer, "_flatten_layers", None)
            layers = list(flatten(include_self=True, recursive=True)) if flatten else [layer]
            cached = tuple(f"{type(sub).__name__} '{sub.name}'" for sub in layers
                           if any(marker in type(sub).__name__ for marker in _MODE_LAYER_MARKERS))
            self.mode_layers[layer] = cached
        return cached

    def _emit_call(self, call: ModelCall, updated: int) -> None:
        self.session.emit(KerasModelCall(step=self.session.step, sampled=True, call=call, updated_variables=updated))

    # -- optimizer steps -------------------------------------------------------------------
    def _apply(self, original: Any, optimizer: Any, args: tuple, kwargs: dict) -> Any:
        if self.apply_depth or not self.watching:
            return original(optimizer, *args, **kwargs)
        self.apply_depth += 1
        try:
            self._before_step(optimizer, args, kwargs)
            result = original(optimizer, *args, **kwargs)
        finally:
            self.apply_depth -= 1
        if not self.inside_fit:
            self._after_step(optimizer)
        return result

    def _before_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        try:
            variables = kwargs.get("trainable_variables", args[1] if len(args) > 1 else None)
            if variables is None:
                variables = getattr(optimizer, "_trainable_variables", None) or ()
            updated = {id(v) for v in variables}
            for ref, call in self.pending:
                model = ref()
                if model is None:
                    continue
                count = sum(id(v) in updated for v in model.trainable_variables)
                if count:
                    self.trained.add(model)
                    self._emit_call(call, count)
            self.pending.clear()
            self.last_input = None
            if not self.inside_fit:
                self.optimizers.add(id(optimizer))
            grads = kwargs.get("grads", args[0] if args else None)
            if self.measure_gradients and self.session.wants(GradientsApplied.kind) and not self.inside_fit \
                    and grads is not None:
                self._gradient_norms(optimizer, list(grads), list(variables))
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("keras optimizer step", error)

    def _gradient_norms(self, optimizer: Any, grads: list, variables: list) -> None:
        """O104: per-variable norms of an eager step's gradients (sampled steps)."""
        import tensorflow as tf

        pairs = [(_variable_name(v), g) for g, v in zip(grads, variables, strict=False) if g is not None]
        if not pairs:
            return
        location = tf_user_location(sys._getframe(4))
        # Eager steps only. Inside tf.function an extra reader of the gradients changes how
        # grappler fuses the gradient ops, and with it the user's weights (measured: 4 of 10
        # arrays differed bitwise on a seeded loop), so traced steps are not measured.
        if tf.executing_eagerly() and self.session.step_sampled(optimizer):
            norms = [(name, float(tf.norm(_dense(g)).numpy())) for name, g in pairs]
            # The step these gradients make (counted once applied).
            self.session.emit(GradientsApplied(step=self.session.step + 1, sampled=True, optimizer=id(optimizer),
                                               norms=norms, called_at=location))

    def _after_step(self, optimizer: Any) -> None:
        try:
            import tensorflow as tf

            if tf.executing_eagerly():
                self.session.count_step(optimizer)
                stop = self.session.should_stop()
            else:  # traced: the outermost tf.function being traced is the training step
                if self.functions:
                    self.step_functions[self.functions[0]] = weakref.ref(optimizer)
                stop = False
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("keras optimizer step", error)
            return
        if stop:
            raise StopRun()

    # -- tf.function calls (K109, steps of compiled loops) ------------------------------------
    def _function_call(self, original: Any, function: Any, args: tuple, kwargs: dict) -> Any:
        if self.functions or self.inside_fit or not self.watching:
            return original(function, *args, **kwargs)  # nested, or Keras's own step functions
        self.functions.append(function)
        try:
            before = self._tracing_count(function)
            result = original(function, *args, **kwargs)
        finally:
            self.functions.pop()
        self._after_function(function, before, args, kwargs, sys._getframe(2), result)
        return result

    @staticmethod
    def _tracing_count(function: Any) -> int:
        try:
            return int(function.experimental_get_tracing_count())
        except Exception:  # noqa: BLE001 - an older or unusual Function: no retracing facts
            return -1

    def _after_function(self, function: Any, before: int, args: tuple, kwargs: dict, caller: Any,
                        result: Any) -> None:
        stop = False
        try:
            if before >= 0 and self.session.wants(FunctionTraced.kind):
                self._count_traces(function, self._tracing_count(function) > before, args, kwargs, caller)
            ref = self.step_functions.get(function)
            optimizer = ref() if ref is not None else None
            if optimizer is not None:
                loss = _returned_loss(result) if self.reads_losses and self.session.wants(TrainLoss.kind) else None
                if loss is not None:  # before the step is counted, as tape.gradient's target in an eager step
                    self._loss(loss, caller, compiled=True)
                self.session.count_step(optimizer)
                stop = self.session.should_stop()
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("tf.function call", error)
        if stop:
            raise StopRun()

    def _count_traces(self, function: Any, traced: bool, args: tuple, kwargs: dict, caller: Any) -> None:
        history = self.histories.get(function)
        if history is None:
            python_function = getattr(function, "python_function", None)
            history = self.histories[function] = TraceHistory(
                name=str(getattr(function, "__name__", None) or getattr(python_function, "__name__", "function")),
                definition=_definition(python_function))
        history.calls += 1
        if not traced:
            history.consecutive_traces = 0
            return
        history.traces.append(self._describe(function, args, kwargs))
        if history.calls > 1:  # the first call always traces
            history.consecutive_traces += 1
            self.session.emit(FunctionTraced(step=self.session.step, sampled=True, history=history,
                                             called_at=tf_user_location(caller)))

    def _describe(self, function: Any, args: tuple, kwargs: dict) -> dict[str, str]:
        if function not in self.signatures:
            try:
                self.signatures[function] = inspect.signature(function.python_function)
            except (TypeError, ValueError, AttributeError):
                self.signatures[function] = None
        signature = self.signatures[function]
        try:
            named = dict(signature.bind(*args, **kwargs).arguments) if signature else {}
        except TypeError:
            named = {}
        if not named:
            named = {f"#{i}": value for i, value in enumerate(args)} | dict(kwargs)
        return {name: _describe_value(value) for name, value in named.items()}


def _returned_loss(result: Any) -> Any:
    """Where a compiled training step returns its loss: the result itself, the first item of a tuple
    or list, or a dict's ``"loss"`` (``_loss`` keeps it only when it is one scalar float tensor)."""
    if isinstance(result, dict):
        return result.get("loss")
    if isinstance(result, (tuple, list)):
        return result[0] if result else None
    return result


def _dense(gradient: Any) -> Any:
    """The values of a gradient (an embedding's IndexedSlices keeps them in ``.values``)."""
    return gradient.values if type(gradient).__name__ == "IndexedSlices" else gradient


def _variable_name(variable: Any) -> str:
    return str(getattr(variable, "path", None) or getattr(variable, "name", "variable"))


def _describe_value(value: Any) -> str:
    if isinstance(value, _PYTHON_SCALARS):
        return f"{type(value).__name__} {value!r}"
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        dims: tuple[int | None, ...] | str
        try:
            dims = tuple(None if d is None else int(d) for d in shape)
        except TypeError:
            dims = "?"
        return f"tensor {dims} {getattr(value.dtype, 'name', value.dtype)}"
    return f"{type(value).__name__} object"


def _definition(function: Any) -> Any:
    from nndoctor.core.findings import Location
    from nndoctor.core.user_code import display_path

    code = getattr(function, "__code__", None)
    if code is None:
        return None
    return Location(display_path(code.co_filename), code.co_firstlineno)


def install(observer: Any, keras: Any) -> LoopObserver | None:
    """The custom-loop observer, its core patches installed (its probes: ``keras/probes.py``)."""
    try:
        loops = LoopObserver(observer, keras)
        loops.install()
    except Exception as error:  # noqa: BLE001 - observer rule: fit/evaluate are still observed
        observer.session.internal_error("tensorflow loop instrumentation", error)
        return None
    return loops
