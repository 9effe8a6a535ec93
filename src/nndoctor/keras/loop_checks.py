"""K checks of TensorFlow custom training loops: the ``training`` flag (K105) and
``tf.function`` retracing (K109).

They read plain facts (``ModelCall``, ``TraceHistory``) that ``nndoctor.keras.tf_loops``
collects from ``Layer.__call__``, ``tf.GradientTape``, ``optimizer.apply`` and
``tf.function`` calls and emits on the run's session (``KerasModelCall``,
``FunctionTraced``). Importing this module never imports TensorFlow or Keras.
"""

from __future__ import annotations

from typing import ClassVar

from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.keras.events import FunctionTraced, KerasModelCall
from nndoctor.keras.facts import ModelCall

# PyTorch's M101/M102 (a module left in the wrong mode) have no Keras form: a Keras model
# has no persistent train/eval mode, the mode is the ``training`` argument of each call (K105).


def _effects(call: ModelCall, training: bool) -> str:
    """What the wrong mode does to the layers this model has."""
    kinds = " ".join(call.mode_layers)
    effects = []
    if "Dropout" in kinds or "GaussianNoise" in kinds:
        effects.append("no dropout/noise" if not training else "dropout/noise makes the predictions random")
    if "BatchNormalization" in kinds:
        effects.append("BatchNormalization uses and never updates its moving statistics" if not training
                       else "BatchNormalization normalises with batch statistics and updates its moving "
                            "statistics from this data")
    if "Random" in kinds:
        effects.append("no augmentation" if not training else "random augmentation is applied")
    return "; ".join(effects)


def _layers_text(call: ModelCall, limit: int = 3) -> str:
    shown = ", ".join(call.mode_layers[:limit])
    more = len(call.mode_layers) - limit
    return shown + (f" and {more} more" if more > 0 else "")


class _LoopCheck(Check):
    scope: ClassVar[str] = "keras"

    def _report_once(self, key: object, message: str, *, location: Location | None, evidence: dict,
                     fix: str | None = None) -> None:
        seen = self.__dict__.setdefault("_seen", set())
        if key in seen:
            return
        seen.add(key)
        self.report(message, location=location, evidence=evidence, fix=fix, step=self.session.step)


@register
class TrainingFlagMisuse(_LoopCheck):
    """A custom training loop calls the model without ``training=True``, or evaluates with it.

    ## What it does
    Watches the calls of Keras models (and layers) made from your code outside ``fit``:
    whether the call passes ``training=``, and whether a ``tf.GradientTape`` is recording.
    It fires when a model that contains Dropout, BatchNormalization, GaussianNoise or
    random-augmentation layers is called inside a ``GradientTape`` *without* a
    ``training`` argument and ``optimizer.apply_gradients``/``apply`` then updates that
    model's variables; and when such a model, already being trained, is called with
    ``training=True`` outside any ``GradientTape`` (an evaluation or prediction). An
    explicit ``training=False`` under a tape is respected: the Keras fine-tuning guide runs a
    frozen base with ``training=False`` on purpose. This is the Keras form of PyTorch's
    forgotten ``model.train()``/``model.eval()`` (M101/M102): a Keras model has no
    persistent mode, the mode is the argument of each call.

    ## Why is this bad?
    Keras layers run in inference mode unless the call says ``training=True``
    (``fit`` passes it for you; a custom loop must pass it itself). Trained without it,
    Dropout never drops and BatchNormalization normalises with its moving statistics,
    which are never updated: the model overfits and the statistics stay at their
    initial values, silently. Evaluated with ``training=True``, Dropout makes the
    predictions random and BatchNormalization updates its moving statistics from the
    evaluation data.

    ## Example
    ```python
    with tf.GradientTape() as tape:
        logits = model(x)  # inference mode: Dropout off, BatchNorm frozen
        loss = loss_fn(y, logits)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    ```

    ## Use instead
    ```python
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
    ...
    val_logits = model(x_val, training=False)
    ```

    ## References
    - TensorFlow, Writing a training loop from scratch (``training=True``):
      https://www.tensorflow.org/guide/keras/writing_a_training_loop_from_scratch
    - Keras, The Layer class, the ``training`` argument:
      https://keras.io/api/layers/base_layer/
    - Keras, Transfer learning & fine-tuning (``training=False`` for a frozen base):
      https://keras.io/guides/transfer_learning/
    """

    code = "K105"
    needs = frozenset({"keras_model_calls"})
    name = "training-flag-misuse"
    severity = Severity.ERROR
    summary = "custom loop calls the model without training=True while training, or with it while evaluating"
    fix = ("pass training=True to the model call inside the GradientTape of the training step, and "
           "training=False (or nothing) when evaluating or predicting")

    def on_keras_model_call(self, event: KerasModelCall) -> None:
        call = event.call
        if call is None:
            return
        if call.under_tape:
            self.training_without_flag(call, event.updated_variables)
        else:
            self.evaluation_with_flag(call, event.step)

    def training_without_flag(self, call: ModelCall, updated: int) -> None:
        if call.training is not None or not call.under_tape or not call.mode_layers:
            return
        message = (f"model '{call.model_name}' is called without training= inside the GradientTape of a "
                   f"training step, and the optimizer then updates {updated} of its variables: "
                   f"{_layers_text(call)} run in inference mode while training ({_effects(call, False)}).")
        self._report_once(("train", call.location), message, location=call.location, evidence={
            "model": call.model_name, "training": None, "mode_layers": list(call.mode_layers),
            "updated_variables": updated})

    def evaluation_with_flag(self, call: ModelCall, steps: int) -> None:
        if call.training is not True or call.under_tape or not call.mode_layers:
            return
        message = (f"model '{call.model_name}' is called with training=True outside any GradientTape after "
                   f"{steps} training step(s): {_layers_text(call)} run in training mode while evaluating "
                   f"({_effects(call, True)}).")
        self._report_once(("eval", call.location), message, location=call.location, evidence={
            "model": call.model_name, "training": True, "mode_layers": list(call.mode_layers),
            "steps": steps}, fix="call the model with training=False (or without training=) when evaluating")


@register
class TfFunctionRetracing(_LoopCheck):
    """A ``tf.function`` traced again on (almost) every call.

    ## What it does
    Counts the calls and the traces (``experimental_get_tracing_count``) of every
    ``tf.function`` your code calls outside ``fit``. It fires when the last
    ``threshold`` calls in a row (the first call excluded) each traced a new graph, and
    names the arguments that differ between the traces: Python numbers or strings
    (each new value is a new graph) or tensors whose shape changes.

    ## Why is this bad?
    Tracing runs the Python function again and builds, optimises and compiles a new
    graph: a step that should take milliseconds takes hundreds, every time, and the
    function's cache grows without bound. Nothing fails; TensorFlow only logs a warning
    that is easy to miss.

    ## Example
    ```python
    @tf.function
    def train_step(x, y, lr):
        ...
    for step, (x, y) in enumerate(batches):
        train_step(x, y, 0.1 * 0.99 ** step)  # a new Python float every step
    ```

    ## Use instead
    ```python
    train_step(x, y, tf.constant(0.1 * 0.99 ** step))  # a tensor: one graph
    # varying shapes: @tf.function(input_signature=[tf.TensorSpec([None, 8]), ...])
    # or @tf.function(reduce_retracing=True)
    ```

    ## References
    - TensorFlow, Better performance with tf.function (rules of tracing, controlling retracing):
      https://www.tensorflow.org/guide/function
    - ``tf.function`` API (``input_signature``, ``reduce_retracing``):
      https://www.tensorflow.org/api_docs/python/tf/function
    """

    code = "K109"
    name = "tf-function-retracing"
    severity = Severity.WARNING
    summary = "a tf.function retraced every step (Python scalars or varying shapes as arguments)"
    fix = ("pass tensors instead of Python numbers (tf.constant / tf.Variable), and for varying shapes give "
           "tf.function an input_signature with None dimensions or reduce_retracing=True")

    threshold = 6

    def on_function_traced(self, event: FunctionTraced) -> None:
        history = event.history
        if history is None or history.consecutive_traces < self.threshold:
            return
        recent = history.traces[-history.consecutive_traces:]
        varying = [name for name in recent[0] if len({trace.get(name) for trace in recent}) > 1]
        causes = []
        for name in varying:
            values = []
            for trace in recent:
                if trace.get(name) not in values:
                    values.append(trace.get(name))
            shown = ", ".join(str(v) for v in values[:3]) + (", …" if len(values) > 3 else "")
            causes.append(f"argument '{name}' ({shown})")
        verb = " changes" if len(causes) == 1 else " change"
        why = ("; ".join(causes) + verb + " from trace to trace" if causes
               else "no argument differs between the traces (the function may close over changing Python state)")
        where = f" defined at {history.definition}" if history.definition else ""
        message = (f"tf.function '{history.name}'{where} was traced {len(history.traces)} times in "
                   f"{history.calls} calls, on each of the last {history.consecutive_traces} calls: {why}.")
        python_values = any(not str(recent[0].get(n, "")).startswith("tensor") for n in varying)
        fix = ("pass the changing Python value as a tensor (tf.constant(value)) or a tf.Variable so one graph "
               "serves every call" if python_values else None)
        self._report_once(("retrace", history.name, history.definition), message, location=event.called_at,
                          evidence={"function": history.name, "traces": len(history.traces),
                                    "calls": history.calls, "varying_arguments": varying}, fix=fix)
