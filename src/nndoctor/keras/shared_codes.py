"""Codes shared with the PyTorch checks, reported from Keras and TensorFlow runs.

D101 (unnormalized input) and D107 (labels out of range) from the batches of ``fit`` /
``evaluate``; O104 (exploding gradients) from the gradients given to a Keras optimizer's
``apply``/``apply_gradients`` in a custom loop.

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
from nndoctor.image_batches import image_layout, unnormalized_pixels
from nndoctor.keras.facts import BatchFacts

# Layers that keep the pixel scale: anything else before the first Conv/Dense (Rescaling,
# Normalization, a Lambda…) may scale the input, so the check stays silent.
_SCALE_PRESERVING = {"Reshape", "Permute", "Flatten", "Cropping2D", "ZeroPadding2D", "RandomFlip",
                     "RandomRotation", "RandomTranslation", "RandomZoom", "RandomCrop"}
_KERAS_FIX = ("scale pixels to 0–1 (keras.layers.Rescaling(1/255) as the first layer, or x / 255) and "
              "normalize with the mean/std of your data or of the pretrained weights")
_LEARNED = {"Conv1D", "Conv2D", "Conv3D", "SeparableConv2D", "DepthwiseConv2D", "Dense"}
SHARED = ("D101", "D107", "O104")
# O104's thresholds (the PyTorch check's): growth over the first steps' median, or huge outright.
_GROWTH, _HUGE = 1e3, 1e5


class SharedCodes:
    def __init__(self, session: Any, checks: dict[str, Rule]) -> None:
        self.session = session
        self.checks = checks
        self.unnormalized = checks.get("D101")
        self._seen: set[object] = set()
        self._norms: dict[int, list[float]] = {}

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

    def _emit(self, code: str, message: str, location: Any, evidence: dict, fix: str | None = None) -> None:
        finding = self.checks[code].finding(message, location=location, fix=fix, evidence=evidence)
        finding.first_step = self.session.step
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
        if x is None or not x.has_values or image_layout(x.shape) is None or batch.phase in self._seen:
            return
        leading = batch.leading_layers
        if not leading or leading[-1] not in _LEARNED or any(n not in _SCALE_PRESERVING for n in leading[:-1]):
            return  # the model may rescale its input before the first learned layer
        dtype = "torch.uint8" if x.dtype == "uint8" else x.dtype
        problem = unnormalized_pixels(dtype, x.min, x.max)
        if problem is None:
            return
        self._seen.add(batch.phase)
        message = (f"the images given to {batch.phase} are {problem}: {x.dtype}{list(x.shape)} in "
                   f"[{x.min:.4g}, {x.max:.4g}] reach the first layer ({leading[-1]}) unscaled "
                   "(normalised images stay within about ±3).")
        self._emit("D101", message, batch.call_location, {
            "input_shape": list(x.shape), "dtype": x.dtype, "min": x.min, "max": x.max,
            "first_layer": leading[-1]}, _KERAS_FIX)
