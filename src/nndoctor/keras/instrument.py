"""Zero-code-change instrumentation of Keras 3 ``Model.fit`` / ``Model.evaluate``.

Importing Keras costs seconds, so nothing here imports it: when the user's script has
already imported Keras at install time it is patched at once, otherwise the post-import hook
(``tfdata.hooks.when_imported``, the one every TensorFlow-side feature uses) patches it right
after the script's own ``import keras``.
Every patch is recorded on the installation's patcher and undone at the end of the run.

What is patched, and why:

* ``Model.compile`` and the constructors of ``BatchNormalization`` and the convolution
  base class record the user's line (weakly, per object) so findings point there;
* ``Model.fit`` / ``Model.evaluate`` mark the call (and its line) and ``fit`` gets one
  extra callback that counts optimizer steps (``--max-steps`` stops the run there);
* ``Model._compute_loss`` sees x, y and the predictions of the first batch of each call,
  *before* the loss runs (a label mismatch may crash the loss itself; probe "keras_batches",
  and on TensorFlow "tf_graph_stats" inside the traced step). Reading them copies
  at most a few hundred rows to NumPy; nothing the model computes changes. When it runs
  eagerly on the CPU (the torch backend, ``run_eagerly=True``) it also reads whether the
  training loss is finite, so N101 can run the failing batch again before its update
  (probe "fit_losses");
* the callback reads ``logs["loss"]`` for N101, L105, L106 and L108 (probe "fit_losses")
  when the next batch begins (from what fit's train function returned, kept by a wrapper set
  on the model for the duration of ``fit``), and ``fit(x, y, shuffle=False)`` has its labels read for D105; after ``fit``
  the first training samples are run through the layers (``Layer.stateless_call``, nothing
  assigned) to see which ReLU units are ever active, for N103.

The probes (patches that only feed some checks) are installed only when an enabled check names
them in ``needs``: ``keras/probes.py``.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nndoctor.core.findings import Location
from nndoctor.core.registry import framework_checks
from nndoctor.core.user_code import user_location
from nndoctor.instrument.features import install_features
from nndoctor.instrument.wrapping import mark_wrapper
from nndoctor.keras import facts as kf
from nndoctor.keras.events import FitEnded, FitStarted, InitialLoss, KerasBatch, TrainLoss
from nndoctor.keras.probes import keras_probes
from nndoctor.tfdata.hooks import when_imported

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol

# Batches an accelerator's training loss is read late (see KerasObserver.settle_batch): by then the
# step that computed it has finished, so reading it does not wait.
LOSS_LAG = 2
# K101 reads the predictions of this many calls of each loss object in a custom loop.
_LOOP_LOSS_CALLS = 2


@dataclass
class _Call:
    phase: str  # "fit" or "evaluate"
    location: Location | None
    x: kf.ArraySummary | None = None  # the arrays given to the call, when they are arrays
    y: kf.ArraySummary | None = None
    observed: bool = False  # a batch with real values was seen
    x_ref: Any = None  # weak reference to the x array given to fit (N101 runs a few rows again)
    first_step: int = 0
    means: list[tuple[int, float]] | None = None  # (batch, logs["loss"]) of fit: L106
    validation_split: float = 0.0
    logs: Any = None  # what fit's train function returned for the last batch (see watch_train_function)
    # (batch, step, loss) of finished batches whose accelerator loss is not read yet (see settle_batch)
    lagged: list[tuple[int, int, Any, Any]] = field(default_factory=list)
    train_function: Any = None  # (model, Keras's train function) while ours wraps it
    logits_kept: bool = False  # the predictions carry the logits of their softmax/sigmoid (TensorFlow)
    classes: int = 0  # outputs of a sparse/categorical cross-entropy classifier (L105, L108)
    accuracies: list[tuple[int, float]] = field(default_factory=list)  # (batch, logs' accuracy): L108
    read_accuracy: bool = False  # labels were given to fit: its accuracy metric is read too (L108)
    batch_size: int = 32


class KerasObserver:
    """The Keras side of one installation: recorded lines, the active call, the K checks."""

    def __init__(self, installation: InstallationProtocol) -> None:
        self.installation = installation
        self.session = installation.session
        self.patched = False
        self.calls: list[_Call] = []
        self.compile_locations: weakref.WeakKeyDictionary[Any, Location] = weakref.WeakKeyDictionary()
        self.layer_locations: weakref.WeakKeyDictionary[Any, Location] = weakref.WeakKeyDictionary()
        self.enabled = True
        self._keras_depth = 0
        self._saved_active = False
        self.backend = ""
        self.fitted: weakref.WeakSet[Any] = weakref.WeakSet()  # models whose first fit was seen (L105)
        # TensorFlow backend: (model, phase) -> the variables its traced step writes batch statistics into.
        self.graph_probes: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        # The probes installed (``keras/probes.py``): the installation's own list, so that a run
        # records them with the others.
        self.probes: list[str] = installation.probes
        self.reads_losses = False  # fit's training losses are read (probe "fit_losses")
        self.loops: Any = None  # TensorFlow backend: the custom-loop observer (``tf_loops.LoopObserver``)

    # -- patching ----------------------------------------------------------------------
    def patch(self, keras: Any) -> None:
        if self.patched:
            return
        self.patched = True
        self.backend = keras.config.backend()
        if self.backend not in ("torch", "tensorflow"):
            return  # JAX traces fit into XLA programs: not covered yet
        from keras.src.layers.convolutional.base_conv import BaseConv

        session = self.session
        # The K checks (and the custom-loop ones) become the session's: the observer emits
        # events, the session dispatches them.
        session.add_checks(framework_checks("keras", session.select, session.ignore))
        patcher = self.installation.patcher
        model_cls = keras.Model
        self._patch_recording_init(keras.layers.BatchNormalization)
        self._patch_recording_init(BaseConv)

        original_compile = patcher.patch(model_cls, "compile", None)

        def compile(model, *args, **kwargs):
            self._guard(lambda: self._remember(self.compile_locations, model))
            return original_compile(model, *args, **kwargs)

        patcher.patch(model_cls, "compile", compile)
        self._patch_call(model_cls, "fit")
        self._patch_call(model_cls, "evaluate")
        self._model_cls = model_cls
        self._loss_name = "_compute_loss" if hasattr(model_cls, "_compute_loss") else "compute_loss"
        self._loss_signature = inspect.signature(getattr(model_cls, self._loss_name))
        self._callback_cls = _make_callback_class(keras, self)
        self._patch_keras_owned(keras.layers.Layer, "__call__")
        self._patch_keras_owned(model_cls, "predict")
        patcher.on_undo(self._disable)
        if self.backend == "tensorflow":
            from nndoctor.keras import tf_loops

            self.loops = tf_loops.install(self, keras)
        # The probes the enabled Keras checks declare in ``needs``, and only those.
        install_features(self, keras_probes(self.backend))

    def patch_imported(self, keras: Any) -> None:
        """Patch Keras once the script has imported it (``tfdata.hooks.when_imported``)."""
        if not hasattr(keras, "Model"):
            return  # a Keras still being imported: what it defines is not there yet
        try:
            self.patch(keras)
        except Exception as error:  # noqa: BLE001 - observer rule: the run goes on unobserved
            self.session.internal_error("keras instrumentation", error)

    def _disable(self) -> None:
        self.enabled = False

    # -- Model.compute_loss: the probes "fit_losses", "keras_batches", "tf_graph_stats" ----------
    # Each wraps the one below it: the graph probe (outermost) and the batch reader run before the
    # loss, in that order, on the first batches of a call; the non-finite check after it.
    def _wrap_compute_loss(self, make: Any) -> None:
        patcher = self.installation.patcher
        original = patcher.patch(self._model_cls, self._loss_name, None)
        patcher.patch(self._model_cls, self._loss_name, make(original))

    def _unobserved_call(self) -> _Call | None:
        """The fit/evaluate call whose first batch with values is not seen yet, if any."""
        call = self.calls[-1] if self.calls else None
        if call is not None and not call.observed and self.enabled and os.getpid() == self.session.pid:
            return call
        return None

    def install_fit_losses(self) -> None:
        """Probe "fit_losses": fit's training losses are read (``settle_batch``), and an eager
        step's non-finite loss is caught before its update (``_check_loss``)."""
        self.reads_losses = True

        def make(original: Any) -> Any:
            def compute_loss(model, *args, **kwargs):
                call = self.calls[-1] if self.calls else None
                loss = original(model, *args, **kwargs)
                if call is not None and call.phase == "fit" and self.enabled and self.session.wants(TrainLoss.kind):
                    self._guard(lambda: self._check_loss(model, call, loss, args, kwargs))
                return loss

            return compute_loss

        self._wrap_compute_loss(make)

    def install_batch_reader(self) -> None:
        """Probe "keras_batches": the first batch of each fit/evaluate, read before the loss runs."""

        def make(original: Any) -> Any:
            def compute_loss(model, *args, **kwargs):
                call = self._unobserved_call()
                if call is not None:
                    try:
                        call.observed = self._observe(model, call, args, kwargs)
                    except Exception as error:  # noqa: BLE001 - observer rule
                        call.observed = True  # do not retry every batch
                        self.session.internal_error("keras instrumentation", error)
                return original(model, *args, **kwargs)

            return compute_loss

        self._wrap_compute_loss(make)

    def install_graph_probe(self) -> None:
        """Probe "tf_graph_stats" (TensorFlow backend): the same batch kept inside the traced step."""

        def make(original: Any) -> Any:
            def compute_loss(model, *args, **kwargs):
                call = self._unobserved_call()
                if call is not None:
                    try:
                        self._probe_graph(model, call, args, kwargs)
                    except Exception as error:  # noqa: BLE001 - observer rule
                        call.observed = True  # do not retry every batch
                        self.session.internal_error("keras instrumentation", error)
                return original(model, *args, **kwargs)

            return compute_loss

        self._wrap_compute_loss(make)

    # -- K101 in custom loops: a Keras loss object called from the user's code outside fit -------
    def install_loss_calls(self) -> None:
        """Probe "keras_loss_calls". A custom loop calls its loss object itself (``loss_fn(y, model(x))``):
        K101 reads the predictions of its first calls, as ``fit``'s compiled loss is read in
        ``compute_loss``, and L105 the value of a classification loss computed before the first
        optimizer step."""
        import keras

        wanted = self.session.wants(KerasBatch.kind)
        initial = self.session.wants(InitialLoss.kind)
        if not wanted and not initial:
            return
        original = self.installation.patcher.patch(keras.losses.Loss, "__call__", None)
        inspected: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

        def __call__(loss, *args, **kwargs):
            watch = not self.calls and self.enabled and inspected.get(loss, 0) < _LOOP_LOSS_CALLS \
                and os.getpid() == self.session.pid
            frame = sys._getframe(1) if watch else None
            if watch:
                self._guard(lambda: self._inspect_loop_loss(loss, args, kwargs, frame, inspected))
            result = original(loss, *args, **kwargs)
            if watch and initial and self.session.step == 0:
                self._guard(lambda: self._loop_initial_loss(loss, args, kwargs, result, frame))
            return result

        mark_wrapper(__call__, original)
        self.installation.patcher.patch(keras.losses.Loss, "__call__", __call__)

    def inspect_loop_input(self, model: Any, x: Any, location: Location | None) -> None:
        """The input a custom loop gives its model under a GradientTape (its first call): D101."""
        if not self.session.wants(KerasBatch.kind):
            return
        self._emit_batch(kf.BatchFacts(
            phase="the training loop", call_location=location, compile_location=None, loss=None,
            output_layer=None, output_activation=None, output_location=None, x=kf.summarize(x), y=None,
            y_pred=None, first_conv=None, leading_layers=_leading_layers(_layers(model)), backend=self.backend))

    def _loop_location(self, frame: Any) -> Location | None:
        from nndoctor.keras.tf_location import tf_user_location

        return tf_user_location(frame) if self.backend == "tensorflow" else user_location(frame)

    def _inspect_loop_loss(self, loss: Any, args: tuple, kwargs: dict, frame: Any,
                           inspected: weakref.WeakKeyDictionary) -> None:
        from nndoctor.keras.tf_location import called_from_user

        config = kf.loss_config(loss)
        if config is None or config.kind is None:
            inspected[loss] = _LOOP_LOSS_CALLS  # not a cross-entropy: nothing to read
            return
        if not called_from_user(frame):
            return  # a loss called by Keras or another library
        y_pred = args[1] if len(args) > 1 else kwargs.get("y_pred")
        pred = kf.summarize(y_pred) if config.from_logits and self.session.wants(KerasBatch.kind) else None
        if pred is None or pred.has_values:
            inspected[loss] = inspected.get(loss, 0) + 1
        if pred is None:
            return
        kept = kf.loss_reads_logits(y_pred, self.backend)
        self._emit_batch(kf.BatchFacts(
            phase="the training loop", call_location=self._loop_location(frame), compile_location=None,
            loss=config, output_layer=None, output_activation=None, output_location=None, x=None, y=None,
            y_pred=pred, first_conv=None, backend=self.backend, logits_kept=kept))

    def _loop_initial_loss(self, loss: Any, args: tuple, kwargs: dict, result: Any, frame: Any) -> None:
        """L105: a sparse/categorical cross-entropy computed eagerly before the first optimizer step."""
        from nndoctor.keras.tf_location import called_from_user

        config = kf.loss_config(loss)
        y_pred = args[1] if len(args) > 1 else kwargs.get("y_pred")
        shape = getattr(y_pred, "shape", None)
        if config is None or config.kind not in ("sparse", "categorical") or shape is None or len(shape) != 2:
            return
        if kf.is_symbolic_value(result) or len(getattr(result, "shape", ()) or ()) != 0 \
                or not called_from_user(frame):
            return  # traced (no value), or a per-sample loss (reduction=None)
        classes = int(shape[-1]) if shape[-1] is not None else 0
        if classes < 2:
            return
        value = float(result.detach() if hasattr(result, "detach") else result)  # one scalar, once
        self.session.emit(InitialLoss(step=0, sampled=True, series=("loop", id(loss)), value=value, classes=classes,
                                      where="the training loop", called_at=self._loop_location(frame)))

    def _enter_keras(self) -> None:
        if self._keras_depth == 0:
            self._saved_active = self.session.active
            self.session.active = False
        self._keras_depth += 1

    def _leave_keras(self) -> None:
        self._keras_depth -= 1
        if self._keras_depth == 0:
            self.session.active = self._saved_active and self.enabled

    def _patch_keras_owned(self, owner: Any, name: str) -> None:
        original = self.installation.patcher.patch(owner, name, None)

        def keras_owned(obj, *args, **kwargs):
            self._enter_keras()
            try:
                return original(obj, *args, **kwargs)
            finally:
                self._leave_keras()

        mark_wrapper(keras_owned, original)
        self.installation.patcher.patch(owner, name, keras_owned)

    def _patch_recording_init(self, cls: Any) -> None:
        original = self.installation.patcher.patch(cls, "__init__", None)

        def __init__(layer, *args, **kwargs):
            original(layer, *args, **kwargs)
            # Only the outermost constructor records (Conv2D -> BaseConv both pass here).
            self._guard(lambda: self._remember(self.layer_locations, layer, keep=True))

        self.installation.patcher.patch(cls, "__init__", __init__)

    def _patch_call(self, model_cls: Any, phase: str) -> None:
        original = self.installation.patcher.patch(model_cls, phase, None)
        signature = inspect.signature(original)

        def call(model, *args, **kwargs):
            record = _Call(phase, None)
            try:
                record.location = user_location(sys._getframe(1))
                given = signature.bind(model, *args, **kwargs).arguments
                record.x, record.y = kf.summarize(given.get("x")), kf.summarize(given.get("y"))
                if phase == "fit":
                    self._before_fit(record, given)
                    args, kwargs = self._with_callback(signature, model, args, kwargs)
            except Exception as error:  # noqa: BLE001 - observer rule: run the user's call as written
                self.session.internal_error(f"keras {phase}", error)
            self.calls.append(record)
            self._enter_keras()
            try:
                return original(model, *args, **kwargs)
            finally:
                self._leave_keras()
                self.calls.pop()
                self._guard(lambda: self.unwatch_train_function(record))
                if self.backend == "tensorflow":
                    self._guard(lambda: self._observe_probe(model, record))
                if phase == "fit":
                    self._guard(lambda: self._after_fit(model, record))

        mark_wrapper(call, original)  # keeps inspect.signature(model.fit) as Keras wrote it
        self.installation.patcher.patch(model_cls, phase, call)

    def _with_callback(self, signature: inspect.Signature, model: Any, args: tuple, kwargs: dict) -> tuple:
        bound = signature.bind(model, *args, **kwargs)
        callbacks = bound.arguments.get("callbacks")
        if callbacks is not None and not isinstance(callbacks, (list, tuple)):
            return args, kwargs  # a CallbackList the user built: leave it alone
        bound.arguments["callbacks"] = [*(callbacks or ()), self._callback_cls()]
        return bound.args[1:], bound.kwargs

    # -- the fit's arrays and training losses: D105, L108, N101, L106, L105, N103 ----------------
    def _before_fit(self, record: _Call, given: dict) -> None:
        record.first_step = self.session.step
        record.means = []
        record.validation_split = float(given.get("validation_split") or 0.0)
        x = given.get("x")
        if x is not None and hasattr(x, "shape") and hasattr(x, "__getitem__"):
            try:
                record.x_ref = weakref.ref(x)
            except TypeError:
                record.x_ref = None
        stateful = any(getattr(layer, "stateful", False) for layer in _layers(given["self"])) \
            if "self" in given else False  # a stateful RNN needs the order: shuffle=False is required there
        record.batch_size = int(given.get("batch_size") or 32)
        session = self.session
        record.read_accuracy = given.get("y") is not None and session.wants(FitEnded.kind)
        if session.wants(FitStarted.kind):
            session.emit(FitStarted(
                step=session.step, sampled=True, model=given.get("self"), labels=given.get("y"),
                arrays=hasattr(x, "shape"), shuffle=given.get("shuffle", True), batch_size=record.batch_size,
                validation_split=record.validation_split, stateful=stateful, called_at=record.location))

    def _check_loss(self, model: Any, call: _Call, loss: Any, args: tuple, kwargs: dict) -> None:
        """N101 before the update: an eager CPU training loss that is NaN/Inf, emitted with its batch
        (to be run again through the layers); a finite one is left to the callback's running mean."""
        if kf.is_symbolic_value(loss):
            return
        values = self._loss_signature.bind(model, *args, **kwargs).arguments
        if not values.get("training", True):
            return  # fit's validation pass
        finite = kf.scalar_finite_on_cpu(loss)
        if finite is False:
            session = self.session
            value = float(loss.detach() if hasattr(loss, "detach") else loss)  # one CPU scalar
            session.emit(TrainLoss(step=session.step, sampled=True, value=value, series=id(model), where="fit",
                                   called_at=call.location, model=model, inputs=values.get("x"), exact=True))

    def settle_batch(self, model: Any, batch: int, *, flush: bool) -> None:
        """The callback's view of one finished training batch (read when the next batch begins, or
        the epoch, validation or training ends): ``logs["loss"]``, the epoch's running mean, for
        N101 and L106. Only while one of them is enabled: a batch-end hook would turn off Keras's
        asynchronous batch-end dispatch instead.

        A loss on an accelerator is read ``LOSS_LAG`` batches late (all of them at ``flush``): reading
        it at once would wait for the step to finish, and the host could no longer prepare the next
        batch while the accelerator computes (measured on an H200, Keras's torch backend, a small CNN:
        ~1.4 ms a step). Its step and batch are those of the batch it belongs to."""
        call = self.calls[-1] if self.calls else None
        if call is None or call.phase != "fit" or not self._reads_losses():
            return
        value = self._batch_loss(model, call)
        if value is not None:
            accuracy = _returned_accuracy(call.logs) if call.read_accuracy else None
            call.lagged.append((batch, self.session.step, value, accuracy))
        keep = LOSS_LAG if not flush and value is not None and _on_accelerator(value) else 0
        while len(call.lagged) > keep:
            batch_, step, loss, accuracy = call.lagged.pop(0)
            self.training_loss(model, batch_, float(loss), step)
            if accuracy is not None:
                call.accuracies.append((batch_, float(accuracy)))

    def _batch_loss(self, model: Any, call: _Call) -> Any:
        """The running mean of the loss after the batch just finished: the scalar fit's train function
        returned (a float or a 0-d tensor, not read here), else the loss tracker's variables."""
        returned = _returned_loss(call.logs)
        if returned is not None:
            return returned
        tracker = getattr(model, "_loss_tracker", None)
        if tracker is None:
            return None
        # No train function of Keras's own watched: the two variables read directly (≈70 µs a
        # step on CPU with TensorFlow) rather than ``result()`` (≈165 µs: it runs a division op
        # first); they change in place at every step, so they are read now, never late.
        total, count = float(tracker.total.numpy()), float(tracker.count.numpy())
        return total / count if count else None

    def watch_train_function(self, model: Any) -> None:
        """At ``on_train_begin`` (``fit`` has just made its train function): keep what the train
        function returns, so the loss is read from the tensor Keras already computed (under a
        microsecond a step) rather than from the tracker's variables (two eager reads, ≈70 µs).
        Only Keras's own ``train_step``, whose ``logs["loss"]`` is the tracker's running mean: a
        user's ``train_step`` may return anything under that name."""
        call = self.calls[-1] if self.calls else None
        original = getattr(model, "train_function", None)
        if call is None or call.phase != "fit" or original is None or not _keras_train_step(model):
            return
        if not self._reads_losses():
            return

        def train_function(*args: Any, **kwargs: Any) -> Any:
            call.logs = None  # a call that raises (StopIteration: the data ran out) ran no batch
            call.logs = original(*args, **kwargs)
            return call.logs

        mark_wrapper(train_function, original)
        call.train_function = (model, original)
        model.train_function = train_function

    @staticmethod
    def unwatch_train_function(call: _Call) -> None:
        """After ``fit``: Keras's train function back on the model (it is reused by the next ``fit``)."""
        if call.train_function is None:
            return
        model, original = call.train_function
        call.train_function = call.logs = None
        if getattr(getattr(model, "train_function", None), "__wrapped__", None) is original:
            model.train_function = original

    def training_loss(self, model: Any, batch: int, value: float, step: int) -> None:
        """One training batch's ``logs["loss"]`` (the epoch's running mean), after ``step`` steps."""
        call = self.calls[-1] if self.calls else None
        if call is None or call.phase != "fit":
            return
        session = self.session
        if not math.isfinite(value) and session.wants(TrainLoss.kind):
            # Run again on the data given to fit: the failing batch ran inside the train function.
            x = call.x_ref() if call.x_ref is not None else None
            session.emit(TrainLoss(step=step, sampled=True, value=value, series=id(model), where="fit",
                                   called_at=call.location, model=model, inputs=x, exact=False))
        if call.means is not None:
            call.means.append((int(batch), value))

    def _after_fit(self, model: Any, record: _Call) -> None:
        session = self.session
        first_fit = model not in self.fitted
        self.fitted.add(model)
        means = record.means or []
        # Batch 0's loss of a model's first fit was computed before any update: L105.
        if means and first_fit and record.classes and means[0][0] == 0 and session.wants(InitialLoss.kind):
            session.emit(InitialLoss(step=0, sampled=True, series=("fit", id(model)), value=means[0][1],
                                     classes=record.classes, where="fit", called_at=record.location))
        if session.wants(FitEnded.kind):
            x = record.x_ref() if record.x_ref is not None else None
            session.emit(FitEnded(
                step=session.step, sampled=True, model=model, inputs=x, validation_split=record.validation_split,
                called_at=record.location, first_step=record.first_step, means=means,
                accuracies=record.accuracies, classes=record.classes, batch_size=record.batch_size))

    def _reads_losses(self) -> bool:
        """Are fit's training losses read (probe "fit_losses": N101 at once; L105, L106 and L108 when
        fit ends)?"""
        return self.reads_losses

    # -- observing ---------------------------------------------------------------------
    def _observe(self, model: Any, call: _Call, args: tuple, kwargs: dict) -> bool:
        """Run the K checks on one batch; True once the predictions had real values."""
        values = self._loss_signature.bind(model, *args, **kwargs).arguments
        call.logits_kept = call.logits_kept or kf.loss_reads_logits(values.get("y_pred"), self.backend)
        x, y, y_pred = (kf.summarize(values.get(k)) for k in ("x", "y", "y_pred"))
        return self._inspect(model, call, x, y, y_pred)

    def _probe_graph(self, model: Any, call: _Call, args: tuple, kwargs: dict) -> None:
        """TensorFlow backend, while fit/evaluate trace their step: add the statistics probe."""
        from nndoctor.keras.tf_graph_probe import TENSORS, GraphProbe, is_symbolic

        values = self._loss_signature.bind(model, *args, **kwargs).arguments
        training = bool(values.get("training", call.phase == "fit"))
        if training != (call.phase == "fit") or not is_symbolic(values.get("y_pred")):
            return  # fit's validation pass, or an eager step (run_eagerly=True reads values directly)
        import tensorflow as tf

        if tf.distribute.has_strategy():
            return  # our variables live outside the strategy's replicas
        probes = self.graph_probes.setdefault(model, {})
        probe = probes.get(call.phase)
        if probe is None:
            with tf.init_scope():  # nndoctor's variables are created eagerly, outside the user's graph
                probe = probes[call.phase] = GraphProbe()  # a tf.function creates variables in its first trace only
        tensors = {name: values.get(name) for name in TENSORS}
        probe.prepare(tensors)  # its variable, in the function's first trace
        if call.phase == "fit" and _builds_optimizer(model):
            return  # a trace TensorFlow discards (see _builds_optimizer): the probe goes into the next one
        probe.record(tensors)

    def _observe_probe(self, model: Any, call: _Call) -> None:
        """After a TensorFlow-backend fit/evaluate: the K checks on the values the probe kept."""
        probe = self.graph_probes.get(model, {}).get(call.phase)
        if probe is None or not self.enabled:
            return
        x, y, y_pred = (probe.read(name) for name in ("x", "y", "y_pred"))
        if y_pred is not None:
            self._inspect(model, call, x, y, y_pred)

    def _inspect(self, model: Any, call: _Call, x: Any, y: Any, y_pred: Any) -> bool:
        # In Keras's symbolic build pass only shapes are real: take the values from the call.
        if x is None or not x.has_values:
            x = call.x or x
        if y is None or not y.has_values:
            y = call.y or y
        output_layer = _output_layer(model)
        layers = _layers(model)
        batch = kf.BatchFacts(
            phase=call.phase,
            call_location=call.location,
            compile_location=self.compile_locations.get(model),
            loss=kf.loss_config(getattr(model, "loss", None)),
            output_layer=getattr(output_layer, "name", None),
            output_activation=kf.activation_name(output_layer),
            output_location=self.layer_location(output_layer),
            x=x,
            y=y,
            y_pred=y_pred,
            first_conv=self._first_conv(layers),
            leading_layers=_leading_layers(layers),
            batch_norms=[
                kf.BatchNormFacts(layer.name, float(layer.momentum), self.layer_location(layer))
                for layer in layers if type(layer).__name__ == "BatchNormalization"
            ],
            backend=self.backend,
            logits_kept=call.logits_kept,
        )
        loss = batch.loss
        if loss is not None and loss.kind in ("sparse", "categorical") and y_pred is not None \
                and len(y_pred.shape) == 2 and y_pred.shape[-1] >= 2:
            call.classes = int(y_pred.shape[-1])
        self._emit_batch(batch)
        return y_pred is None or y_pred.has_values

    def _emit_batch(self, batch: kf.BatchFacts) -> None:
        self.session.emit(KerasBatch(step=self.session.step, sampled=True, facts=batch))

    def _first_conv(self, layers: list[Any]) -> kf.ConvFacts | None:
        from keras.src.layers.convolutional.base_conv import BaseConv

        for layer in layers:
            if isinstance(layer, BaseConv) and getattr(layer, "kernel", None) is not None:
                in_channels = int(layer.kernel.shape[-2]) * int(getattr(layer, "groups", 1) or 1)
                return kf.ConvFacts(layer.name, str(layer.data_format), in_channels, self.layer_location(layer))
        return None

    def layer_location(self, layer: Any) -> Location | None:
        if layer is None:
            return None
        try:
            return self.layer_locations.get(layer)
        except TypeError:
            return None

    def count_step(self, model: Any) -> None:
        self.session.count_step(getattr(model, "optimizer", None) or model)

    # -- helpers -----------------------------------------------------------------------
    @staticmethod
    def _remember(table: weakref.WeakKeyDictionary, obj: Any, *, keep: bool = False) -> None:
        """Record the user's line for ``obj`` (``keep``: the first record wins)."""
        if keep and obj in table:
            return
        location = user_location(sys._getframe(1))
        if location is not None:
            table[obj] = location

    def _guard(self, action: Any) -> None:
        try:
            action()
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("keras instrumentation", error)


def _builds_optimizer(model: Any) -> bool:
    """Keras's own ``train_step`` traced before the optimizer has its variables: this first trace
    creates them, and TensorFlow then traces the step again and runs only that second graph
    (``tf.function`` retraces a function whose first trace created variables), so probe ops in
    the first one would be built for nothing. Tracing them is a measurable part of a small
    model's ``fit``."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or getattr(optimizer, "built", True) or not getattr(model, "trainable_weights", None):
        return False
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return getattr(type(model), "train_step", None) is TensorFlowTrainer.train_step


def _returned_loss(logs: Any) -> Any:
    """The scalar ``logs["loss"]`` a train function returned: a float, or a 0-d TensorFlow or torch
    tensor (not read here: see ``settle_batch``); None when there is none."""
    value = logs.get("loss") if isinstance(logs, dict) else None
    if isinstance(value, (int, float)):
        return float(value)
    shape = getattr(value, "shape", None)
    if shape is None or len(shape) != 0:
        return None
    return value


_ACCURACY_KEYS = ("accuracy", "acc", "sparse_categorical_accuracy", "categorical_accuracy")


def _returned_accuracy(logs: Any) -> Any:
    """The running accuracy a train function returned (a compiled accuracy metric), or None."""
    if not isinstance(logs, dict):
        return None
    for key in _ACCURACY_KEYS:
        value = logs.get(key)
        if isinstance(value, (int, float)) or (value is not None and len(getattr(value, "shape", (1,))) == 0):
            return value
    return None


def _on_accelerator(value: Any) -> bool:
    """A tensor held by a GPU/TPU/MPS device (torch ``device.type``, TensorFlow's device string);
    False for floats and CPU tensors, which are read at once."""
    device = getattr(value, "device", None)
    if device is None:
        return False
    kind = str(getattr(device, "type", None) or device).lower()
    return bool(kind) and "cpu" not in kind


def _keras_train_step(model: Any) -> bool:
    """The model trains with Keras's own ``train_step`` (the backend trainer's, not the user's)."""
    step = getattr(type(model), "train_step", None)
    return getattr(step, "__module__", "").startswith("keras.src.backend.")


def _layers(model: Any) -> list[Any]:
    flatten = getattr(model, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=False, recursive=True))
    return list(getattr(model, "layers", []))


def _leading_layers(layers: list[Any]) -> tuple[str, ...]:
    from keras.src.layers.convolutional.base_conv import BaseConv

    names = []
    for layer in layers:
        name = type(layer).__name__
        if name == "InputLayer":
            continue
        names.append(name)
        if isinstance(layer, BaseConv) or name == "Dense" or len(names) >= 16:
            break
    return tuple(names)


def _output_layer(model: Any) -> Any:
    """The layer producing a single-output Sequential or functional model's output."""
    import keras

    if isinstance(model, keras.Sequential):
        layers = model.layers
        return layers[-1] if layers else None
    outputs = getattr(model, "_outputs", None)
    if isinstance(outputs, (list, tuple)) and len(outputs) == 1:
        history = getattr(outputs[0], "_keras_history", None)
        if history is not None:
            return history[0]
    return None  # a subclassed model: the output layer is not known, values still are


def _make_callback_class(keras: Any, observer: KerasObserver) -> type:
    from nndoctor.core.engine import StopRun  # noqa: F401 - raised below

    class NndoctorCallback(keras.callbacks.Callback):
        """Counts optimizer steps; stops the run at ``--max-steps``.

        A step is counted when the next batch begins, or when validation, the epoch or the
        training ends, never in a batch-end hook: a callback that overrides
        ``on_train_batch_end`` turns off Keras's asynchronous dispatch of batch-end callbacks
        (each step's logs would be converted to Python numbers on the training thread).
        The step that reaches the limit is the last one run, as with a batch-end hook.
        """

        def __init__(self) -> None:
            super().__init__()
            self._pending = False  # a batch began and is not counted yet
            self._batch = 0  # its index in the epoch

        def on_train_begin(self, logs: Any = None) -> None:
            if observer.enabled and os.getpid() == observer.session.pid:
                observer._guard(lambda: observer.watch_train_function(self.model))

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._settle(flush=False)
            self._pending, self._batch = True, batch

        def on_test_begin(self, logs: Any = None) -> None:
            self._settle()  # fit's validation pass: the epoch's steps are done

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self._settle()

        def on_train_end(self, logs: Any = None) -> None:
            self._settle()

        def _settle(self, flush: bool = True) -> None:
            if not self._pending:
                return
            self._pending = False
            session = observer.session
            if not observer.enabled or os.getpid() != session.pid:
                return
            try:
                observer.settle_batch(self.model, self._batch, flush=flush)
                observer.count_step(self.model)
            except Exception as error:  # noqa: BLE001 - observer rule
                session.internal_error("keras callback", error)
                return
            if session.should_stop():
                from nndoctor.core.engine import StopRun

                raise StopRun()

    return NndoctorCallback


def install(installation: InstallationProtocol) -> None:
    observer = KerasObserver(installation)
    when_imported("keras", observer.patch_imported, installation.patcher)
