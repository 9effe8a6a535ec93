"""K checks: Keras 3 ``fit`` / ``evaluate`` bugs (K101–K104, K108).

Each check is an ordinary ``on_<kind>`` check: it reads the ``BatchFacts`` (plain numbers, see
``nndoctor.keras.facts``) of a ``KerasBatch`` event, which the Keras instrumentation emits on
the run's session for the first batch of every ``fit`` and ``evaluate`` call (and custom
loops' first batches). Importing this module never imports Keras.
"""

from __future__ import annotations

from typing import Any, ClassVar

from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.keras.events import KerasBatch
from nndoctor.keras.facts import looks_like_probabilities

_PROBABILITY_ACTIVATIONS = ("softmax", "sigmoid")
# A channel axis is this small; spatial axes are larger.
_CHANNEL_SIZES = (1, 2, 3, 4)
# ...and the axes that are not channels are at least this large (images, not tiny feature maps).
_MIN_SPATIAL = 8


# The probes that give the first batch of each fit/evaluate (``keras/probes.py``): read in
# ``Model.compute_loss`` (eager values), and kept inside the traced step on TensorFlow.
BATCH_PROBES = frozenset({"keras_batches", "tf_graph_stats"})


class KerasCheck(Check):
    """A check that the Keras observer enables on the session (``registry.framework_checks``)."""

    scope: ClassVar[str] = "keras"

    def _report_once(self, key: object, message: str, *, location: Location | None, evidence: dict,
                     severity: Severity | None = None) -> None:
        seen = self.__dict__.setdefault("_seen", set())
        if key in seen:
            return
        seen.add(key)
        self.report(message, location=location, evidence=evidence, step=self.session.step, severity=severity)


class KerasVariant(Check):
    """The Keras/TensorFlow class of a code PyTorch owns (``registry.register_variant``: one catalog
    entry, the owner's metadata), enabled by the Keras observer on the session
    (``keras/data_variants.py``, ``keras/training_variants.py``)."""

    scope: ClassVar[str] = "keras"

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._seen: set[object] = set()

    def _once(self, key: object) -> bool:
        """True the first time ``key`` is seen (one finding per model, phase or line)."""
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


def _where(location: Location | None) -> str:
    return f" ({location})" if location else ""


@register
class SoftmaxWithFromLogits(KerasCheck):
    """Probabilities (softmax/sigmoid outputs) given to a loss built with ``from_logits=True``.

    ## What it does
    Looks at the compiled loss of a single-output model and at the predictions of the first
    batch of ``fit``/``evaluate``, and at the first calls of a Keras loss object from your own
    code (a custom ``GradientTape`` loop). It fires when the loss is a cross-entropy with
    ``from_logits=True`` and the model's last layer applies ``softmax``/``sigmoid``, the
    predictions are probabilities (every value in [0, 1], every row summing to 1), or, on the
    TensorFlow backend, the predictions are the output of a Keras softmax/sigmoid (a traced
    ``Softmax``/``Sigmoid`` op inside ``tf.function``).

    What happens then depends on the backend (measured with Keras 3.15):

    * **torch backend**, and **TensorFlow when the probabilities were made any other way**
      (``tf.nn.softmax`` or a cast after the softmax, run eagerly): the loss applies
      softmax/sigmoid to the probabilities again. It sees values squeezed into [0, 1], the
      gradients shrink, training is slow or stalls, and nothing crashes (error).
    * **TensorFlow backend, output of a Keras softmax/sigmoid**: Keras keeps the logits on the
      tensor the activation returns (and traces a ``Softmax`` op back to its input inside
      ``tf.function``) and computes the loss on those logits, whatever ``from_logits`` says; it
      prints a ``UserWarning``. Loss and gradients equal those of a linear head with
      ``from_logits=True``: this run trains. The code still says two contradictory things, and
      it breaks silently when the backend changes to torch, or when the probabilities pass
      through another op before the loss (warning).

    ## Why is this bad?
    With ``from_logits=True`` the loss treats its input as unnormalized logits. The Keras docs
    say to use it only with a linear head. Where the backend does not rescue the mismatch,
    softmax is applied twice and the model learns little; where it does, the result depends on
    an implementation detail of one backend.

    ## Example
    ```python
    model = keras.Sequential([keras.layers.Dense(10, activation="softmax")])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ```

    ## Use instead
    ```python
    model = keras.Sequential([keras.layers.Dense(10)])  # logits
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ```
    or keep the softmax and use the default ``from_logits=False``.

    ## References
    - Keras losses, `from_logits`: https://keras.io/api/losses/probabilistic_losses/
    - TensorFlow, Basic classification ("from_logits=True" with a linear head):
      https://www.tensorflow.org/tutorials/keras/classification
    - Keras source, TensorFlow backend, ``_get_logits`` (the substitution and its UserWarning):
      https://github.com/keras-team/keras/blob/master/keras/src/backend/tensorflow/nn.py
    """

    code = "K101"
    needs = BATCH_PROBES | {"keras_loss_calls"}  # and a custom loop's loss objects
    name = "softmax-with-from-logits"
    severity = Severity.ERROR
    summary = "softmax/sigmoid outputs into a loss with `from_logits=True`"
    fix = "Remove the final softmax/sigmoid (output logits), or compile the loss with from_logits=False."

    def on_keras_batch(self, event: KerasBatch) -> None:
        batch = event.facts
        if batch is None:
            return
        loss, pred = batch.loss, batch.y_pred
        if loss is None or loss.kind is None or not loss.from_logits or pred is None:
            return
        in_loop = batch.phase not in ("fit", "evaluate")
        if not pred.has_values and not (in_loop and batch.logits_kept):
            return  # wait for a batch with real predictions: the message states their range
        structural = batch.output_activation in _PROBABILITY_ACTIVATIONS
        measured = pred.has_values and looks_like_probabilities(pred)
        if not (structural or measured or batch.logits_kept):
            return
        if structural:
            what = f"the last layer '{batch.output_layer}' applies {batch.output_activation}"
        elif batch.logits_kept:
            what = "the predictions are the output of a Keras softmax/sigmoid"
        else:
            what = "the predictions are probabilities"
        ranges = f"; predictions in [{pred.min:.3g}, {pred.max:.3g}]" if pred.has_values else ""
        sums = f", rows sum to 1 within {pred.row_sum_deviation:.1e}" if measured else ""
        where_layer = _where(batch.output_location) if structural else ""
        if batch.logits_kept:
            severity = Severity.WARNING
            consequence = (
                f"On the TensorFlow backend Keras 3 computes this loss on the logits before that softmax/sigmoid "
                f"(the tensor keeps them), so this run trains as a linear head with from_logits=True would{where_layer}; "
                f"the code is inconsistent all the same: the same code applies softmax/sigmoid twice on the torch "
                f"backend, and on TensorFlow as soon as the probabilities pass through another op before the loss "
                f"(tf.nn.softmax or a cast, run eagerly).")
        else:
            severity = Severity.ERROR
            consequence = (f"The loss applies softmax/sigmoid to them again, which flattens the gradients{where_layer}"
                           + (" (Keras on TensorFlow substitutes the logits only for the direct output of its own "
                              "softmax/sigmoid, which these are not)." if batch.backend == "tensorflow" else "."))
        message = f"{loss.name}(from_logits=True) receives probabilities: {what}{ranges}{sums}. {consequence}"
        where = batch.compile_location or batch.call_location
        self._report_once(("loss", where), message, location=where, severity=severity, evidence={
            "loss": loss.name, "from_logits": True, "output_activation": batch.output_activation,
            "pred_min": pred.min if pred.has_values else None, "pred_max": pred.max if pred.has_values else None,
            "backend": batch.backend, "loss_uses_logits_before_activation": batch.logits_kept,
            "phase": batch.phase})


@register
class LogitsWithoutFromLogits(KerasCheck):
    """Unbounded outputs (logits) given to a loss that expects probabilities (``from_logits=False``).

    ## What it does
    Fires when a cross-entropy loss is compiled with ``from_logits=False`` (the default, and
    what the string losses use), the model's last layer has no softmax/sigmoid, and the
    predictions of the first batch fall outside [0, 1].

    ## Why is this bad?
    With ``from_logits=False`` Keras treats the predictions as probabilities: it clips them
    into [ε, 1 − ε] (and, for the categorical losses, divides by their sum). Logits outside
    that range are clipped, so their gradient is zero and the model learns little or
    nothing, silently; negative values make the normalisation meaningless.

    ## Example
    ```python
    model = keras.Sequential([keras.layers.Dense(10)])  # linear head: logits
    model.compile(loss="sparse_categorical_crossentropy")  # from_logits=False
    ```

    ## Use instead
    ```python
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ```
    or end the model with ``activation="softmax"``.

    ## References
    - Keras losses, `from_logits`: https://keras.io/api/losses/probabilistic_losses/
    - TensorFlow, Basic classification: https://www.tensorflow.org/tutorials/keras/classification
    """

    code = "K102"
    needs = BATCH_PROBES
    name = "logits-without-from-logits"
    severity = Severity.ERROR
    summary = "unbounded outputs into a loss that expects probabilities"
    fix = "Compile the loss with from_logits=True, or end the model with a softmax/sigmoid activation."

    def on_keras_batch(self, event: KerasBatch) -> None:
        batch = event.facts
        if batch is None:
            return
        loss, pred = batch.loss, batch.y_pred
        if loss is None or loss.kind is None or loss.from_logits or pred is None or not pred.has_values:
            return
        if batch.output_activation in _PROBABILITY_ACTIVATIONS:
            return
        tolerance = 1e-3
        if pred.min >= -tolerance and pred.max <= 1 + tolerance:
            return
        head = (f"the last layer '{batch.output_layer}' has activation '{batch.output_activation}'"
                if batch.output_activation else "the model's output has no softmax/sigmoid")
        message = (f"{loss.name} expects probabilities (from_logits=False) but {head} and the "
                   f"predictions span [{pred.min:.3g}, {pred.max:.3g}]; Keras clips them into (0, 1), "
                   f"so clipped values get no gradient.")
        where = batch.compile_location or batch.call_location
        self._report_once(("loss", where), message, location=where, evidence={
            "loss": loss.name, "from_logits": False, "output_activation": batch.output_activation,
            "pred_min": pred.min, "pred_max": pred.max})


@register
class LabelEncodingMismatch(KerasCheck):
    """One-hot labels with a ``Sparse*`` loss, or integer labels with a ``Categorical*`` loss.

    ## What it does
    Compares the labels of the first batch with the loss: a sparse categorical loss expects
    one integer class per sample, a categorical loss one one-hot (or probability) row per
    sample. It fires when the labels are one-hot rows (0/1, one 1 per row, as many columns as
    the model has outputs) under a sparse loss, or integer class ids (one column, values
    above 1) under a categorical loss.

    ## Why is this bad?
    Depending on the shapes, the loss either crashes with a shape error far from the cause
    or, worse, broadcasts an integer column against the class axis and trains on a
    meaningless target. Keras documents the two encodings as distinct losses.

    ## Example
    ```python
    y = keras.utils.to_categorical(labels, 10)
    model.compile(loss="sparse_categorical_crossentropy")
    model.fit(x, y)
    ```

    ## Use instead
    ```python
    model.compile(loss="categorical_crossentropy")  # one-hot labels
    # or keep the sparse loss and pass the integer labels
    ```

    ## References
    - Keras, SparseCategoricalCrossentropy and CategoricalCrossentropy:
      https://keras.io/api/losses/probabilistic_losses/
    - keras.utils.to_categorical: https://keras.io/api/utils/python_utils/#tocategorical-function
    """

    code = "K103"
    needs = BATCH_PROBES
    name = "label-encoding-mismatch"
    severity = Severity.ERROR
    summary = "one-hot labels with a sparse loss, or integer labels with a categorical loss"
    fix = "Use the loss that matches the labels (Sparse* for integer ids, Categorical* for one-hot)."

    def on_keras_batch(self, event: KerasBatch) -> None:
        batch = event.facts
        if batch is None:
            return
        loss, y, pred = batch.loss, batch.y, batch.y_pred
        if loss is None or y is None or pred is None or len(pred.shape) < 2:
            return
        classes = pred.shape[-1]
        if classes < 2:
            return
        one_hot = (len(y.shape) == len(pred.shape) and y.shape[-1] == classes and y.binary_valued
                   and y.row_sum_deviation == 0)
        integer_ids = (y.integer_valued and y.min >= 0 and y.max >= 2 and y.max < classes
                       and (len(y.shape) == len(pred.shape) - 1
                            or (len(y.shape) == len(pred.shape) and y.shape[-1] == 1)))
        if loss.kind == "sparse" and one_hot:
            message = (f"{loss.name} expects one integer class id per sample, but the labels are one-hot "
                       f"rows: shape {y.shape} with {classes} columns of 0/1 summing to 1.")
        elif loss.kind == "categorical" and integer_ids:
            message = (f"{loss.name} expects one-hot rows of {classes} columns, but the labels are integer "
                       f"class ids: shape {y.shape}, values {y.min:.0f}..{y.max:.0f}.")
        else:
            return
        self._report_once(("labels", batch.phase), message, location=batch.call_location, evidence={
            "loss": loss.name, "label_shape": list(y.shape), "prediction_shape": list(pred.shape)})


@register
class KerasBatchNormMomentumFromPytorch(KerasCheck):
    """Keras ``BatchNormalization(momentum=…)`` at or below 0.5: a PyTorch momentum ported as is.

    ## What it does
    Lists the model's ``BatchNormalization`` layers when ``fit`` starts and fires for each one
    whose ``momentum`` is ≤ 0.5.

    ## Why is this bad?
    The two frameworks define the word in opposite ways. PyTorch updates
    ``running = (1 − momentum) · running + momentum · batch`` (default 0.1); Keras updates
    ``moving = momentum · moving + (1 − momentum) · batch`` (default 0.99). ``momentum=0.1``
    copied from PyTorch makes the Keras moving statistics follow the last few batches
    only, so inference uses noisy statistics and validation accuracy jumps around.

    ## Example
    ```python
    keras.layers.BatchNormalization(momentum=0.1)  # PyTorch's default, ported as is
    ```

    ## Use instead
    ```python
    keras.layers.BatchNormalization(momentum=0.9)  # = PyTorch momentum 0.1
    ```

    ## References
    - Keras BatchNormalization: https://keras.io/api/layers/normalization_layers/batch_normalization/
    - PyTorch BatchNorm2d (momentum definition): https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm2d.html
    """

    code = "K104"
    needs = BATCH_PROBES
    name = "keras-bn-momentum-from-pytorch"
    severity = Severity.WARNING
    summary = "Keras BatchNormalization momentum ≤ 0.5 (a PyTorch momentum ported as a decay)"
    fix = "Use momentum = 1 − (PyTorch momentum), e.g. 0.9 for PyTorch's 0.1; Keras's default is 0.99."

    threshold = 0.5

    def on_keras_batch(self, event: KerasBatch) -> None:
        batch = event.facts
        if batch is None:
            return
        for bn in batch.batch_norms:
            if bn.momentum > self.threshold:
                continue
            message = (f"BatchNormalization '{bn.layer_name}' has momentum={bn.momentum:g}: in Keras the moving "
                       f"statistics keep {bn.momentum:.0%} of their value per batch (PyTorch's momentum "
                       f"{bn.momentum:g} means the opposite). Did you mean {1 - bn.momentum:g}?")
            self._report_once(("bn", bn.layer_name), message, location=bn.location or batch.call_location,
                              evidence={"layer": bn.layer_name, "momentum": bn.momentum})


@register
class DataFormatMismatch(KerasCheck):
    """Channels-first data into ``channels_last`` convolutions, or the reverse.

    ## What it does
    Compares the first convolution's ``data_format`` with the shape of the data given to
    ``fit``/``evaluate``. It fires when the convolution reads its channels from the axis
    that is large (a spatial axis, as its kernel shows) while the other end holds a small
    axis of 1–4 (the real channels) and every other axis is at least 8 long: e.g. images
    of shape (N, 3, 32, 32) into a ``Conv2D`` with the default ``channels_last``. Small
    feature maps (a 4×4 board with 16 planes) are left alone.

    ## Why is this bad?
    The model still builds and trains: it treats 32 columns as channels and the 3 colour
    planes as a spatial axis, so convolutions mix the wrong values and accuracy plateaus
    low with no error. PyTorch data loaders produce channels-first tensors; Keras defaults
    to channels-last.

    ## Example
    ```python
    x = images  # (N, 3, 32, 32), from a PyTorch pipeline
    model = keras.Sequential([keras.Input((3, 32, 32)), keras.layers.Conv2D(8, 3)])
    ```

    ## Use instead
    ```python
    x = np.transpose(images, (0, 2, 3, 1))  # (N, 32, 32, 3)
    # or keras.layers.Conv2D(8, 3, data_format="channels_first")
    ```

    ## References
    - Keras Conv2D, `data_format`: https://keras.io/api/layers/convolution_layers/convolution2d/
    - keras.config.image_data_format: https://keras.io/api/utils/config_utils/#imagedataformat-function
    """

    code = "K108"
    needs = BATCH_PROBES
    name = "data-format-mismatch"
    severity = Severity.ERROR
    summary = "channels_first data into channels_last layers or the reverse"
    fix = "Transpose the data to the layers' data_format, or set data_format on the conv layers."

    def on_keras_batch(self, event: KerasBatch) -> None:
        batch = event.facts
        if batch is None:
            return
        conv, x = batch.first_conv, batch.x
        if conv is None or x is None or len(x.shape) < 4:
            return
        first, last = x.shape[1], x.shape[-1]
        large = _MIN_SPATIAL
        if conv.data_format == "channels_last" and conv.in_channels == last and first in _CHANNEL_SIZES \
                and min(x.shape[2:]) >= large:
            data, real = "channels_first", first
        elif conv.data_format == "channels_first" and conv.in_channels == first and last in _CHANNEL_SIZES \
                and min(x.shape[1:-1]) >= large:
            data, real = "channels_last", last
        else:
            return  # small feature maps (a 4x4 board with 16 planes) are left alone
        message = (f"the data given to {batch.phase} has shape {x.shape} (looks {data}: {real} channels) but "
                   f"'{conv.layer_name}' uses data_format='{conv.data_format}' and reads {conv.in_channels} "
                   f"channels{_where(conv.location)}; the model treats a spatial axis as channels.")
        self._report_once(("format", conv.layer_name), message, location=batch.call_location, evidence={
            "input_shape": list(x.shape), "data_format": conv.data_format, "in_channels": conv.in_channels})
