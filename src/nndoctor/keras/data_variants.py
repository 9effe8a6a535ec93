"""The Keras variants of the PyTorch data codes: D101 (unnormalized input) and D107 (labels out
of range) from the batches of ``fit``/``evaluate`` and custom loops, D105 (unshuffled data) from
the arrays given to ``fit(shuffle=False)``.

Each class shares its code's one catalog entry (``registry.register_variant``: name, severity,
docs and fix are the PyTorch check's) and applies the same pure rules (``nndoctor.core.rules.image_batches``,
``nndoctor.tfdata.labels``) to the facts the Keras observer emits; importing this module imports
neither PyTorch nor Keras.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from nndoctor.core.registry import register_variant
from nndoctor.core.rules.image_batches import (
    flattened_image_side,
    image_layout,
    raw_flattened_pixels,
    unnormalized_pixels,
)
from nndoctor.keras.checks import BATCH_PROBES, KerasVariant
from nndoctor.keras.events import FitStarted, KerasBatch
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
# D105 reads the labels of at most this many batches of fit(shuffle=False), spread evenly over the
# epoch (a first class block may span hundreds of batches: a prefix would see one label only).
_LABEL_BATCHES = 512


@register_variant
class KerasUnnormalizedInput(KerasVariant):
    """D101 on the images (or flattened images) Keras gives its first learned layer unscaled."""

    code = "D101"
    needs = BATCH_PROBES | {"keras_model_calls"}  # and a custom loop's first input

    def on_keras_batch(self, event: KerasBatch) -> None:
        batch = event.facts
        x = batch.x if batch is not None else None
        if batch is None or x is None or not x.has_values or batch.phase in self._seen:
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
        evidence: dict[str, Any] = {"input_shape": list(x.shape), "dtype": x.dtype, "min": x.min, "max": x.max,
                                    "first_layer": leading[-1]}
        if flat is not None:
            evidence["flattened_image"] = list(flat)
        self.report(message, location=batch.call_location, evidence=evidence, fix=_KERAS_FIX,
                    step=self.session.step)


@register_variant
class KerasLabelsOutOfRange(KerasVariant):
    """D107 on the labels given to a Keras cross-entropy: class ids outside [0, C) for a sparse
    loss, targets outside [0, 1] for a binary one."""

    code = "D107"
    needs = BATCH_PROBES

    def on_keras_batch(self, event: KerasBatch) -> None:
        batch = event.facts
        if batch is None:
            return
        loss, y, pred = batch.loss, batch.y, batch.y_pred
        if loss is None or y is None or not y.has_values or pred is None or batch.phase in self._seen:
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
        self._seen.add(batch.phase)
        self.report(message, location=batch.call_location, fix=fix, step=self.session.step, evidence={
            "loss": loss.name, "label_min": y.min, "label_max": y.max, "outputs": classes})


@register_variant
class KerasUnshuffledFit(KerasVariant):
    """D105 on ``fit(x, y, shuffle=False)`` (or ``"batch"``) over labels stored in class order."""

    code = "D105"

    def on_fit_started(self, event: FitStarted) -> None:
        shuffle, y = event.shuffle, event.labels
        if y is None or not event.arrays or event.stateful or shuffle is True or event.called_at in self._seen:
            return  # a stateful RNN carries its state from batch to batch: shuffle=False is required there
        batch_size = event.batch_size
        batches = ordered_batches(y, batch_size, event.validation_split)
        found = ordered_evidence(batches) if batches else None
        if found is None:
            return
        self._seen.add(event.called_at)
        single, usable, distinct = found
        how = "shuffle='batch' (which shuffles whole batches, not the samples in them)" if shuffle == "batch" \
            else "shuffle=False"
        message = (f"fit(..., {how}) trains on the arrays in their stored order, and the labels are sorted by "
                   f"class: {single} of {usable} batches of {batch_size} read over the epoch are single-class (one label "
                   f"≥ {DOMINANT_SHARE:.0%}), dominated by {distinct} different labels in turn. Shuffled balanced "
                   f"data gives such a batch with probability ≤ "
                   f"{chance_single_class(max(distinct, 2), MIN_BATCH_SIZE):.1%}.")
        self.report(message, location=event.called_at, step=self.session.step, evidence={
            "shuffle": shuffle, "batch_size": batch_size, "single_class_batches": single, "batches": usable,
            "dominant_labels": distinct, "batch_summaries": [list(b) for b in batches or ()][:usable]},
            fix="let fit shuffle (the default shuffle=True), or shuffle the arrays once with one permutation "
                "of x and y before fit")


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
