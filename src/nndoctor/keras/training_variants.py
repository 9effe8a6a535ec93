"""The Keras/TensorFlow variants of the PyTorch training codes: N101 (non-finite loss), N103
(dead ReLU units), L105 (initial loss far above chance), L106 (loss not decreasing), L108 (loss
stuck at chance) and O104 (exploding gradients).

They read the events the Keras observer emits (``TrainLoss``, ``FitEnded``, ``InitialLoss``,
``GradientsApplied`` …). Each shares its code's one catalog entry with the PyTorch check
(``registry.register_variant``) and its thresholds and pure rules (``nndoctor.core.rules.loss_trend``,
``initial_loss``, ``chance_level``, ``dead_units``, ``gradient_explosion``), so a TensorFlow-only
install decides as PyTorch does. Importing this module imports neither PyTorch nor Keras.
"""

from __future__ import annotations

import math
from typing import Any

from nndoctor.core.events import RunEnd
from nndoctor.core.registry import register_variant
from nndoctor.core.rules import dead_units
from nndoctor.core.rules.chance_level import BatchOutcome, at_chance, chance_sentence, confirmed
from nndoctor.core.rules.gradient_explosion import (
    EXPLOSION_GROWTH,
    EXPLOSION_HUGE,
    explosion_verdict,
)
from nndoctor.core.rules.initial_loss import KERAS_INITIAL_LOGIT_STD, initial_loss_finding
from nndoctor.core.rules.loss_trend import (
    MAX_TREND_VALUES,
    TREND_MIN_STEPS,
    halved,
    loss_trend,
    trend_sentence,
)
from nndoctor.keras import nonfinite
from nndoctor.keras.checks import BATCH_PROBES, KerasVariant
from nndoctor.keras.data_variants import label_ids
from nndoctor.keras.events import FitEnded, FitStarted, GradientsApplied, InitialLoss, TrainLoss


@register_variant
class KerasNonfiniteLoss(KerasVariant):
    """N101 once per model or loop: the step, and the first layer whose output is non-finite."""

    code = "N101"
    needs = frozenset({"fit_losses", "tape_losses", "keras_model_calls"})  # the batch to run again

    def on_train_loss(self, event: TrainLoss) -> None:
        if math.isfinite(event.value) or not self._once(event.series):
            return
        model, x, step = event.model, event.inputs, event.step
        walked = None
        try:
            walked = nonfinite.first_nonfinite_layer(model, x) if model is not None else None
        except Exception as error:  # noqa: BLE001 - a layer that cannot run alone: report without it
            self.session.internal_error("N101 layer walk", error)
        layer, samples = walked if walked is not None else (None, 0)
        origin = nonfinite.Origin(step=step, walked=walked is not None, exact=event.exact, layer=layer,
                                  samples=samples, batch_seen=model is not None and x is not None,
                                  compiled=event.compiled)
        self.report(nonfinite.explain(origin, event.where), location=event.called_at, step=step, evidence={
            "step": step, "layer": layer.name if layer else None, "layer_class": layer.class_name if layer else None,
            "layer_inputs_finite": layer.inputs_finite if layer else None,
            "layer_weights_finite": layer.weights_finite if layer else None,
            "failing_batch": event.exact, "samples_run": samples, "compiled_step": event.compiled},
            fix="fix the layer named in the message (clamp before log/sqrt, e.g. keras.ops.log(keras.ops.maximum(t, "
                "1e-6)); add an epsilon to divisions; a loss with from_logits=True instead of log of a softmax), "
                "lower the learning rate or clip gradients (the optimizer's clipnorm=/global_clipnorm=)")


def _is_relu(layer: Any) -> bool:
    """A ReLU layer, or a layer with a relu/relu6 activation (Dense(activation="relu"), Activation)."""
    if type(layer).__name__ == "ReLU":
        return getattr(layer, "negative_slope", 0) in (0, 0.0, None)
    activation = getattr(layer, "activation", None)
    name = activation if isinstance(activation, str) else getattr(activation, "__name__", None)
    return name in ("relu", "relu6")


@register_variant
class KerasDeadRelu(KerasVariant):
    """N103 after ``fit``: ReLU layers whose units stay at 0 on the first training samples, run
    again through the layers (nothing assigned)."""

    code = "N103"

    def on_fit_ended(self, event: FitEnded) -> None:
        model, x = event.model, event.inputs
        if x is None:
            return
        import numpy as np
        from keras import ops

        split = event.validation_split
        limit = len(x) if not split else int(math.floor(len(x) * (1.0 - split)))
        layers: dict[str, list[Any]] = {}  # name -> [class, units seen active, batches, samples]

        def visit(layer: Any, args: tuple, kwargs: dict, output: Any, weights: list) -> None:
            if not _is_relu(layer):
                return
            shape = tuple(int(d) for d in output.shape)
            # Reduced where the output lives (a GPU on the torch backend): only the per-unit
            # answer is copied out, not the activations (32 × 96 × 96 × 64 floats are 75 MB; copying
            # and scanning them on the host cost ~1 s per fit of a small CNN on an H200).
            if len(shape) < 2 or not bool(ops.convert_to_numpy(ops.all(ops.isfinite(output)))):
                return  # NaN weights or inputs are N101's story, not dead units
            ever_positive = ops.any(ops.greater(output, 0), axis=tuple(range(len(shape) - 1)))
            active = np.asarray(ops.convert_to_numpy(ever_positive)).astype(bool)
            entry = layers.setdefault(str(layer.name), [type(layer).__name__, np.zeros_like(active), 0, 0])
            if entry[1].shape != active.shape:
                return
            entry[1] |= active
            entry[2] += 1
            entry[3] += shape[0]

        rows_per_batch = dead_units.SAMPLES_PER_BATCH
        for start in range(0, dead_units.MIN_BATCHES * rows_per_batch, rows_per_batch):
            rows = x[start:min(start + rows_per_batch, limit)]
            if len(rows) < rows_per_batch // 2 or nonfinite.walk_layers(model, rows, visit) is None:
                break
        for name, (kind, union, batches, samples) in layers.items():
            units = int(union.size)
            dead = units - int(union.sum())
            if not dead_units.is_dead_layer(dead, units, batches, samples) or not self._once((id(model), name)):
                continue
            threshold = dead_units.DEAD_FRACTION
            self.report(
                f"`{name}` ({kind}): {dead} of {units} units ({dead / units:.0%}) were never active (output 0 for "
                f"every sample) on {samples} training samples in {batches} batches, run through the layers after "
                f"fit — threshold {threshold:.0%}. These units get no gradient and cannot recover.",
                location=event.called_at, step=self.session.step,
                evidence={"layer": name, "dead_units": dead, "units": units, "batches": batches,
                          "samples": samples, "threshold": threshold},
                fix="lower the learning rate, use he_normal initialisation or LeakyReLU/GELU, or add "
                    "BatchNormalization before the ReLU")


@register_variant
class KerasInitialLoss(KerasVariant):
    """L105 on the first loss of a model's training, before any update: a classification loss far
    above ln(C) (saturated logits, unscaled inputs)."""

    code = "L105"
    needs = BATCH_PROBES | {"keras_loss_calls", "fit_losses"}  # the class count, and the first loss

    def on_initial_loss(self, event: InitialLoss) -> None:
        if not self._once(event.series):
            return
        found = initial_loss_finding([event.value], event.classes, KERAS_INITIAL_LOGIT_STD)
        if found is None:
            return
        message, evidence = found
        self.report(message.replace("before any optimizer step", f"of {event.where} before any update"),
                    location=event.called_at, evidence=evidence, step=0)


class LossSeries:
    """The training losses of one model's ``fit`` calls, or of one custom loop's ``tape.gradient``."""

    def __init__(self, location: Any, step: int, where: str) -> None:
        self.location = location
        self.where = where
        self.first_step = step
        self.last_step = step
        self.values: list[float] = []
        self.optimizers: set[int] = set()

    def add(self, value: float, step: int) -> None:
        self.values.append(value)
        self.last_step = step
        if len(self.values) > MAX_TREND_VALUES:
            self.values = halved(self.values)


def batch_losses_from_means(means: list[tuple[int, float]]) -> list[float]:
    """Per-batch losses from Keras's running epoch means (batch index, mean of batches 0..index).

    Keras's callbacks see ``logs["loss"]``, the mean over the epoch so far; batch ``b``'s own
    loss is ``(b + 1)·m_b − b·m_{b−1}`` (equal batch sizes). A gap in the indices (callbacks
    called every few batches) drops the batch after it.
    """
    out = []
    previous: tuple[int, float] | None = None
    for index, mean in means:
        if index == 0:
            out.append(mean)
        elif previous is not None and previous[0] == index - 1:
            out.append((index + 1) * mean - index * previous[1])
        previous = (index, mean)
    return out


@register_variant
class KerasLossNotDecreasing(KerasVariant):
    """L106 at the end of the run, on each model's ``fit`` losses and each custom loop's."""

    code = "L106"
    needs = frozenset({"fit_losses", "tape_losses"})

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._series: dict[object, LossSeries] = {}

    def _of(self, key: object, location: Any, step: int, where: str) -> LossSeries:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = LossSeries(location, step, where)
        return series

    def on_train_loss(self, event: TrainLoss) -> None:
        if event.in_fit:
            return  # fit's per-batch losses are recovered from its running means when it ends
        series = self._of(event.series, event.called_at, event.step, event.where)
        series.add(event.value, event.step)
        series.optimizers |= event.optimizers

    def on_fit_ended(self, event: FitEnded) -> None:
        if not event.means:
            return
        series = self._of(("fit", id(event.model)), event.called_at, event.first_step, "fit")
        for value in batch_losses_from_means(event.means):
            series.add(value, self.session.step)
        series.last_step = self.session.step

    def on_run_end(self, event: RunEnd) -> None:
        series_list, self._series = list(self._series.values()), {}
        for series in series_list:
            self._conclude(series)

    def _conclude(self, series: LossSeries) -> None:
        if len(series.optimizers) > 1 or series.last_step - series.first_step < TREND_MIN_STEPS:
            return  # several optimizers (a GAN's losses need not decrease), or too short a run
        verdict = loss_trend(series.values)
        if verdict is None:
            return
        kind, z, ratio = verdict
        n = len(series.values)
        what = trend_sentence(kind, z, ratio, n, subject=f"the training loss of {series.where}", values=series.values)
        self.report(what + ".", location=series.location, step=series.first_step, evidence={
            "trend": kind, "mann_kendall_z": z, "jump_ratio" if kind == "jumped" else "thirds_ratio": ratio,
            "losses_observed": n, "first": series.values[:3], "last": series.values[-3:]})


@register_variant
class KerasLossAtChance(KerasVariant):
    """L108 on one ``fit``: each batch's loss (and accuracy, when a metric gives it) recovered from
    the running epoch means, against the loss and accuracy of the labels' class prior."""

    code = "L108"
    needs = BATCH_PROBES | {"fit_losses"}  # the class count, and the running loss and accuracy

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._counts: dict[int, list[float] | None] = {}  # id(model) -> class counts of the fit running

    def on_fit_started(self, event: FitStarted) -> None:
        self._counts[id(event.model)] = label_counts(event.labels, event.validation_split)

    def on_fit_ended(self, event: FitEnded) -> None:
        counts = self._counts.pop(id(event.model), None)
        key = id(event.model)
        if not event.means or not event.classes or counts is None or len(counts) > event.classes \
                or key in self._seen:
            return
        counts = counts + [0.0] * (event.classes - len(counts))
        losses = batch_losses_from_means(event.means)
        accuracies = event.accuracies
        rates = batch_losses_from_means(accuracies) if len(accuracies) == len(event.means) else []
        use_accuracy = len(rates) == len(losses)
        size = event.batch_size
        batches = [BatchOutcome(step, loss, round(rates[step] * size) if use_accuracy else -1,
                                size if use_accuracy else 0) for step, loss in enumerate(losses)]
        found = at_chance(batches, counts)
        if found is None or not confirmed(batches, counts, found):
            return
        self._seen.add(key)
        self.report(chance_sentence(found).replace("the classifier", "the classifier trained by fit", 1) + ".",
                    location=event.called_at, evidence=found, step=found["from_step"])


def label_counts(y: Any, validation_split: float) -> list[float] | None:
    """Class counts of the training part of the labels given to ``fit`` (L108's prior)."""
    if y is None:
        return None
    import numpy as np

    labels = label_ids(y)
    if labels is None or labels.size == 0 or labels.min() < 0:
        return None
    if validation_split:
        labels = labels[: int(math.floor(len(labels) * (1.0 - validation_split)))]
    return [float(c) for c in np.bincount(labels)]


@register_variant
class KerasExplodingGradients(KerasVariant):
    """O104 on the gradients a custom loop gives a Keras optimizer (eager, sampled steps)."""

    code = "O104"
    needs = frozenset({"gradient_norms"})

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._norms: dict[int, list[float]] = {}

    def on_gradients_applied(self, event: GradientsApplied) -> None:
        norms, key = event.norms, event.optimizer
        if key in self._seen or not norms:
            return
        total = math.sqrt(sum(n * n for _, n in norms))
        if not math.isfinite(total):
            return  # non-finite gradients are N101's story
        history = self._norms.setdefault(key, [])
        history.append(total)
        verdict = explosion_verdict(history, EXPLOSION_GROWTH, EXPLOSION_HUGE)
        if verdict is None:
            return
        kind, _, baseline = verdict
        why = (f"{total / baseline:.3g}× the {baseline:.3g} of the first sampled steps (threshold "
               f"{EXPLOSION_GROWTH:g}×)" if kind == "growth" else f"above {EXPLOSION_HUGE:g}")
        self._seen.add(key)
        name, largest = max(norms, key=lambda item: item[1])
        self.report(f"Total gradient norm {total:.3g} given to the optimizer at step {event.step} is {why}; "
                    f"largest: {name} ({largest:.3g}). Gradients are exploding.", location=event.called_at,
                    step=self.session.step, evidence={
                        "total_norm": total, "baseline_norm": baseline, "largest_variable": name,
                        "history": history[-8:]},
                    fix="lower the learning rate, clip gradients (keras optimizers' clipnorm= / global_clipnorm=), "
                        "normalise inputs and targets")
