"""Codes shared with the PyTorch checks, reported from Keras and TensorFlow runs.

D101 (unnormalized input) and D107 (labels out of range) from the batches of ``fit`` /
``evaluate``; O104 (exploding gradients) from the gradients given to a Keras optimizer's
``apply``/``apply_gradients`` in a custom loop; N101 (non-finite loss) and L106 (loss not
decreasing) from the losses of ``fit`` (its callback's logs) and of eager custom loops
(``tape.gradient``'s target); D105 (unshuffled data) from the arrays given to
``fit(shuffle=False)``.

The PyTorch check class owns the code, name, docs and fix (one catalog entry per code);
this module applies the same rule (``nndoctor.image_batches``) to the batch facts Keras gives
us and emits the finding from the catalog table, honouring ``--select``/``--ignore`` like any
check — without importing the PyTorch checks, so it works on a TensorFlow-only installation.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from nndoctor.catalog_table import Rule, is_enabled, rule
from nndoctor.chance_level import BatchOutcome, at_chance, chance_sentence, confirmed
from nndoctor.image_batches import (
    flattened_image_side,
    image_layout,
    raw_flattened_pixels,
    unnormalized_pixels,
)
from nndoctor.initial_loss import KERAS_INITIAL_LOGIT_STD, initial_loss_finding
from nndoctor.keras import nonfinite
from nndoctor.keras.facts import BatchFacts
from nndoctor.loss_trend import TREND_MIN_STEPS, loss_trend, trend_sentence
from nndoctor.tfdata.labels import (
    DOMINANT_SHARE,
    MIN_BATCH_SIZE,
    chance_single_class,
    ordered_evidence,
)

# Layers that keep the pixel scale: anything else before the first Conv/Dense (Rescaling,
# Normalization, a Lambda…) may scale the input, so the check stays silent.
_SCALE_PRESERVING = {"Reshape", "Permute", "Flatten", "Cropping2D", "ZeroPadding2D", "RandomFlip",
                     "RandomRotation", "RandomTranslation", "RandomZoom", "RandomCrop"}
_KERAS_FIX = ("scale pixels to 0–1 (keras.layers.Rescaling(1/255) as the first layer, or x / 255) and "
              "normalize with the mean/std of your data or of the pretrained weights")
_LEARNED = {"Conv1D", "Conv2D", "Conv3D", "SeparableConv2D", "DepthwiseConv2D", "Dense"}
SHARED = ("D101", "D107", "O104", "N101", "L106", "D105", "N103", "L105", "L108")
# N103's thresholds (the PyTorch check's): ≥ 90% of a ReLU layer's units never active over at least
# 64 samples in 4 batches; a batch is 32 samples (the PyTorch check reads the first 32 of each batch).
_DEAD_FRACTION, _MIN_RELU_SAMPLES, _MIN_RELU_BATCHES, _RELU_BATCH = 0.9, 64, 4, 32
# L106 keeps at most this many losses per series (halving the resolution beyond, like the PyTorch check).
_MAX_LOSSES = 4096
# D105 reads the labels of at most this many batches of fit(shuffle=False), spread evenly over the
# epoch (a first class block may span hundreds of batches: a prefix would see one label only).
_LABEL_BATCHES = 512
# O104's thresholds (the PyTorch check's): growth over the first steps' median, or huge outright.
_GROWTH, _HUGE = 1e3, 1e5


def _is_relu(layer: Any) -> bool:
    """A ReLU layer, or a layer with a relu/relu6 activation (Dense(activation="relu"), Activation)."""
    if type(layer).__name__ == "ReLU":
        return getattr(layer, "negative_slope", 0) in (0, 0.0, None)
    activation = getattr(layer, "activation", None)
    name = activation if isinstance(activation, str) else getattr(activation, "__name__", None)
    return name in ("relu", "relu6")


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
        if len(self.values) > _MAX_LOSSES:
            v = self.values
            self.values = [(v[i] + v[i + 1]) / 2 for i in range(0, len(v) - 1, 2)]


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


def label_ids(y: Any) -> Any:
    """Integer class ids of a label array: 1-D integers, an (N, 1) column, or one-hot rows."""
    import numpy as np

    values = np.asarray(y)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim == 2 and values.shape[1] >= 2 and np.all((values == 0) | (values == 1)) \
            and np.all(values.sum(axis=1) == 1):
        values = values.argmax(axis=1)
    if values.ndim != 1 or values.size == 0 or values.dtype == object:
        return None
    if not np.issubdtype(values.dtype, np.integer) and not np.all(np.mod(values, 1) == 0):
        return None  # regression targets
    return values.astype(np.int64)


def ordered_batches(y: Any, batch_size: int, validation_split: float) -> list[tuple[int, float, int]] | None:
    """The label summaries of the training batches ``fit`` draws from ``y`` unshuffled: every
    batch of the epoch, or ``_LABEL_BATCHES`` of them spread evenly over it."""
    import math
    from collections import Counter

    labels = label_ids(y)
    if labels is None:
        return None
    if validation_split:  # Keras keeps the first part for training, the last for validation
        labels = labels[: int(math.floor(len(labels) * (1.0 - validation_split)))]
    batches = math.ceil(len(labels) / batch_size) if batch_size > 0 else 0
    picked = range(batches) if batches <= _LABEL_BATCHES else sorted(
        {round(i * (batches - 1) / (_LABEL_BATCHES - 1)) for i in range(_LABEL_BATCHES)})
    summaries = []
    for index in picked:
        batch = labels[index * batch_size:(index + 1) * batch_size].tolist()
        label, count = Counter(batch).most_common(1)[0]
        summaries.append((int(label), count / len(batch), len(batch)))
    return summaries


class SharedCodes:
    def __init__(self, session: Any, checks: dict[str, Rule]) -> None:
        self.session = session
        self.checks = checks
        self.unnormalized = checks.get("D101")
        self._seen: set[object] = set()
        self._norms: dict[int, list[float]] = {}
        self._losses: dict[object, LossSeries] = {}

    @classmethod
    def for_session(cls, session: Any) -> SharedCodes | None:
        checks = {}
        for code in SHARED:
            found = rule(code)
            if is_enabled(found, session.select, session.ignore):
                checks[code] = found
        return cls(session, checks) if checks else None

    def inspect(self, batch: BatchFacts) -> None:
        for code, apply_rule in (("D101", self._unnormalized_input), ("D107", self._labels_out_of_range)):
            if code not in self.checks:
                continue
            try:
                apply_rule(batch)
            except Exception as error:  # noqa: BLE001 - observer rule
                self.session.internal_error(f"{code} on keras batch", error)

    def _emit(self, code: str, message: str, location: Any, evidence: dict, fix: str | None = None,
              step: int | None = None) -> None:
        finding = self.checks[code].finding(message, location=location, fix=fix, evidence=evidence)
        finding.first_step = self.session.step if step is None else step
        self.session.add_finding(finding)

    def _labels_out_of_range(self, batch: BatchFacts) -> None:
        """D107: class ids outside [0, C) for a sparse loss, targets outside [0, 1] for a binary one."""
        loss, y, pred = batch.loss, batch.y, batch.y_pred
        if loss is None or y is None or not y.has_values or pred is None or ("D107", batch.phase) in self._seen:
            return
        classes = pred.shape[-1] if pred.shape else -1
        if loss.kind == "sparse" and classes >= 2 and y.integer_valued and y.max >= classes:
            message = (f"{loss.name} on a {classes}-way output expects class ids 0..{classes - 1}, but the labels "
                       f"given to {batch.phase} span {y.min:.0f}..{y.max:.0f} (numbered from 1?).")
            fix = "map the labels to 0..C-1 (e.g. y - 1), or give the last layer as many units as classes"
        elif loss.kind == "binary" and (y.max > 1 or y.min < 0):
            message = (f"{loss.name} expects targets in [0, 1], but the targets given to {batch.phase} span "
                       f"[{y.min:.4g}, {y.max:.4g}] (masks saved as 0/255?).")
            fix = "scale the targets to [0, 1] (e.g. masks / 255)"
        else:
            return
        self._seen.add(("D107", batch.phase))
        self._emit("D107", message, batch.call_location, {
            "loss": loss.name, "label_min": y.min, "label_max": y.max, "outputs": classes}, fix)

    # -- N101 ------------------------------------------------------------------------------
    def wants_nonfinite(self, key: object) -> bool:
        return "N101" in self.checks and ("N101", key) not in self._seen

    def wants_nonfinite_anywhere(self) -> bool:
        return "N101" in self.checks

    def nonfinite_loss(self, key: object, step: int, location: Any, where: str, model: Any, x: Any,
                       *, exact: bool, compiled: bool = False) -> None:
        """N101 once per model/loop: the step, and the first layer whose output is non-finite on ``x``."""
        if not self.wants_nonfinite(key):
            return
        self._seen.add(("N101", key))
        walked = None
        try:
            walked = nonfinite.first_nonfinite_layer(model, x) if model is not None else None
        except Exception as error:  # noqa: BLE001 - a layer that cannot run alone: report without it
            self.session.internal_error("N101 layer walk", error)
        layer, samples = walked if walked is not None else (None, 0)
        origin = nonfinite.Origin(step=step, walked=walked is not None, exact=exact, layer=layer, samples=samples,
                                  batch_seen=model is not None and x is not None, compiled=compiled)
        self._emit("N101", nonfinite.explain(origin, where), location, {
            "step": step, "layer": layer.name if layer else None, "layer_class": layer.class_name if layer else None,
            "layer_inputs_finite": layer.inputs_finite if layer else None,
            "layer_weights_finite": layer.weights_finite if layer else None,
            "failing_batch": exact, "samples_run": samples, "compiled_step": compiled}, step=step,
            fix="fix the layer named in the message (clamp before log/sqrt, e.g. keras.ops.log(keras.ops.maximum(t, "
                "1e-6)); add an epsilon to divisions; a loss with from_logits=True instead of log of a softmax), "
                "lower the learning rate or clip gradients (the optimizer's clipnorm=/global_clipnorm=)")

    # -- N103 ------------------------------------------------------------------------------
    def dead_relu_after_fit(self, model: Any, x: Any, validation_split: float, location: Any) -> None:
        """N103: ReLU layers whose units stay at 0 on the first training samples, run after ``fit``."""
        if "N103" not in self.checks or x is None:
            return
        import numpy as np
        from keras import ops

        limit = len(x) if not validation_split else int(math.floor(len(x) * (1.0 - validation_split)))
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

        for start in range(0, _MIN_RELU_BATCHES * _RELU_BATCH, _RELU_BATCH):
            rows = x[start:min(start + _RELU_BATCH, limit)]
            if len(rows) < _RELU_BATCH // 2 or nonfinite.walk_layers(model, rows, visit) is None:
                break
        for name, (kind, union, batches, samples) in layers.items():
            units = int(union.size)
            dead = units - int(union.sum())
            key = ("N103", id(model), name)
            if batches < _MIN_RELU_BATCHES or samples < _MIN_RELU_SAMPLES or not units \
                    or dead / units < _DEAD_FRACTION or key in self._seen:
                continue
            self._seen.add(key)
            self._emit("N103", (
                f"`{name}` ({kind}): {dead} of {units} units ({dead / units:.0%}) were never active (output 0 for "
                f"every sample) on {samples} training samples in {batches} batches, run through the layers after "
                f"fit — threshold {_DEAD_FRACTION:.0%}. These units get no gradient and cannot recover."),
                location, {"layer": name, "dead_units": dead, "units": units, "batches": batches,
                           "samples": samples, "threshold": _DEAD_FRACTION},
                fix="lower the learning rate, use he_normal initialisation or LeakyReLU/GELU, or add "
                    "BatchNormalization before the ReLU")

    # -- L106 ------------------------------------------------------------------------------
    def loss_series(self, key: object, location: Any, step: int, where: str) -> LossSeries | None:
        if "L106" not in self.checks:
            return None
        series = self._losses.get(key)
        if series is None:
            series = self._losses[key] = LossSeries(location, step, where)
        return series

    def conclude(self) -> None:
        """At the end of the run: L106 on every loss series."""
        for series in self._losses.values():
            try:
                self._loss_trend(series)
            except Exception as error:  # noqa: BLE001 - observer rule
                self.session.internal_error("L106 on keras losses", error)
        self._losses.clear()

    def _loss_trend(self, series: LossSeries) -> None:
        if len(series.optimizers) > 1 or series.last_step - series.first_step < TREND_MIN_STEPS:
            return  # several optimizers (a GAN's losses need not decrease), or too short a run
        verdict = loss_trend(series.values)
        if verdict is None:
            return
        kind, z, ratio = verdict
        n = len(series.values)
        what = trend_sentence(kind, z, ratio, n, subject=f"the training loss of {series.where}", values=series.values)
        self._emit("L106", what + ".", series.location, {
            "trend": kind, "mann_kendall_z": z, "jump_ratio" if kind == "jumped" else "thirds_ratio": ratio, "losses_observed": n,
            "first": series.values[:3], "last": series.values[-3:]}, step=series.first_step)

    # -- D105 ------------------------------------------------------------------------------
    def unshuffled_fit(self, y: Any, shuffle: Any, batch_size: int, validation_split: float, location: Any) -> None:
        """D105: ``fit(x, y, shuffle=False)`` (or ``"batch"``) on labels stored in class order."""
        if "D105" not in self.checks or shuffle is True or ("D105", location) in self._seen:
            return
        try:
            batches = ordered_batches(y, batch_size, validation_split)
            found = ordered_evidence(batches) if batches else None
            if found is None:
                return
            self._seen.add(("D105", location))
            single, usable, distinct = found
            how = "shuffle='batch' (which shuffles whole batches, not the samples in them)" if shuffle == "batch" \
                else "shuffle=False"
            message = (f"fit(..., {how}) trains on the arrays in their stored order, and the labels are sorted by "
                       f"class: {single} of {usable} batches of {batch_size} read over the epoch are single-class (one label "
                       f"≥ {DOMINANT_SHARE:.0%}), dominated by {distinct} different labels in turn. Shuffled balanced "
                       f"data gives such a batch with probability ≤ "
                       f"{chance_single_class(max(distinct, 2), MIN_BATCH_SIZE):.1%}.")
            self._emit("D105", message, location, {
                "shuffle": shuffle, "batch_size": batch_size, "single_class_batches": single, "batches": usable,
                "dominant_labels": distinct, "batch_summaries": [list(b) for b in batches or ()][:usable]},
                fix="let fit shuffle (the default shuffle=True), or shuffle the arrays once with one permutation "
                    "of x and y before fit")
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("D105 on keras fit", error)

    def gradient_norms(self, optimizer_key: int, norms: list[tuple[str, float]], step: int, location: Any) -> None:
        """O104 on one sampled step's per-variable gradient norms (name, norm)."""
        if "O104" not in self.checks or ("O104", optimizer_key) in self._seen or not norms:
            return
        try:
            total = math.sqrt(sum(n * n for _, n in norms))
            if not math.isfinite(total):
                return  # non-finite gradients are N101's story
            history = self._norms.setdefault(optimizer_key, [])
            history.append(total)
            baseline = statistics.median(history[:3])
            if len(history) > 3 and baseline > 0 and total >= _GROWTH * baseline:
                why = f"{total / baseline:.3g}× the {baseline:.3g} of the first sampled steps (threshold {_GROWTH:g}×)"
            elif total >= _HUGE:
                why = f"above {_HUGE:g}"
            else:
                return
            self._seen.add(("O104", optimizer_key))
            name, largest = max(norms, key=lambda item: item[1])
            self._emit("O104", (f"Total gradient norm {total:.3g} given to the optimizer at step {step} is {why}; "
                                f"largest: {name} ({largest:.3g}). Gradients are exploding."), location, {
                "total_norm": total, "baseline_norm": baseline, "largest_variable": name, "history": history[-8:]},
                fix="lower the learning rate, clip gradients (keras optimizers' clipnorm= / global_clipnorm=), "
                    "normalise inputs and targets")
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("O104 on keras gradients", error)

    def _unnormalized_input(self, batch: BatchFacts) -> None:
        x = batch.x
        if x is None or not x.has_values or batch.phase in self._seen:
            return
        flat = flattened_image_side(x.shape) if image_layout(x.shape) is None else None
        if image_layout(x.shape) is None and flat is None:
            return
        leading = batch.leading_layers
        if not leading or leading[-1] not in _LEARNED or any(n not in _SCALE_PRESERVING for n in leading[:-1]):
            return  # the model may rescale its input before the first learned layer
        if flat is not None:
            problem = raw_flattened_pixels(x.shape, x.dtype, x.min, x.max, x.integer_valued)
            what = f"the inputs given to {batch.phase} are flattened images ({flat[0]}×{flat[0]}" + \
                (f"×{flat[1]}" if flat[1] > 1 else "") + ") of"
        else:
            dtype = "torch.uint8" if x.dtype == "uint8" else x.dtype
            problem = unnormalized_pixels(dtype, x.min, x.max)
            what = f"the images given to {batch.phase} are"
        if problem is None:
            return
        self._seen.add(batch.phase)
        message = (f"{what} {problem}: {x.dtype}{list(x.shape)} in "
                   f"[{x.min:.4g}, {x.max:.4g}] reach the first layer ({leading[-1]}) unscaled "
                   "(normalised images stay within about ±3).")
        evidence = {"input_shape": list(x.shape), "dtype": x.dtype, "min": x.min, "max": x.max,
                    "first_layer": leading[-1]}
        if flat is not None:
            evidence["flattened_image"] = list(flat)
        self._emit("D101", message, batch.call_location, evidence, _KERAS_FIX)

    # -- L105 ------------------------------------------------------------------------------
    def initial_loss(self, key: object, losses: list[float], classes: int, location: Any, where: str) -> None:
        """L105 on the first loss(es) of a model's training, before any update: a classification
        loss far above ln(C) (saturated logits, unscaled inputs)."""
        if "L105" not in self.checks or ("L105", key) in self._seen:
            return
        self._seen.add(("L105", key))
        found = initial_loss_finding(losses, classes, KERAS_INITIAL_LOGIT_STD)
        if found is None:
            return
        message, evidence = found
        self._emit("L105", message.replace("before any optimizer step", f"of {where} before any update"),
                   location, evidence, step=0)

    # -- L108 ------------------------------------------------------------------------------
    def label_counts(self, y: Any, validation_split: float) -> list[float] | None:
        """Class counts of the training part of the labels given to ``fit`` (L108's prior)."""
        if "L108" not in self.checks:
            return None
        import numpy as np

        labels = label_ids(y)
        if labels is None or labels.size == 0 or labels.min() < 0:
            return None
        if validation_split:
            labels = labels[: int(math.floor(len(labels) * (1.0 - validation_split)))]
        return [float(c) for c in np.bincount(labels)]

    def loss_at_chance(self, key: object, means: list[tuple[int, float]], accuracies: list[tuple[int, float]],
                       counts: list[float], batch_size: int, location: Any) -> None:
        """L108 on one fit: each batch's loss (and accuracy, when a metric gives it) from the running
        epoch means; steps counted from the start of this fit."""
        if "L108" not in self.checks or ("L108", key) in self._seen:
            return
        losses = batch_losses_from_means(means)
        rates = batch_losses_from_means(accuracies) if len(accuracies) == len(means) else []
        use_accuracy = len(rates) == len(losses)
        batches = [BatchOutcome(step, loss, round(rates[step] * batch_size) if use_accuracy else -1,
                                batch_size if use_accuracy else 0) for step, loss in enumerate(losses)]
        found = at_chance(batches, counts)
        if found is None or not confirmed(batches, counts, found):
            return
        self._seen.add(("L108", key))
        self._emit("L108", chance_sentence(found).replace("the classifier", "the classifier trained by fit", 1) + ".",
                   location, found, step=found["from_step"])
