"""Codes shared with the PyTorch checks, reported from Keras ``fit``/``evaluate`` (D101 so far).

The PyTorch check class owns the code, name, docs and fix (one catalog entry per code);
this module applies the same rule (``nndoctor.image_batches``) to the batch facts Keras gives
us and emits the finding from the catalog table, honouring ``--select``/``--ignore`` like any
check — without importing the PyTorch checks, so it works on a TensorFlow-only installation.
"""

from __future__ import annotations

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


class SharedCodes:
    def __init__(self, session: Any, unnormalized: Rule) -> None:
        self.session = session
        self.unnormalized = unnormalized
        self._seen: set[object] = set()

    @classmethod
    def for_session(cls, session: Any) -> SharedCodes | None:
        found = rule("D101")
        if not is_enabled(found, session.select, session.ignore):
            return None
        return cls(session, found)

    def inspect(self, batch: BatchFacts) -> None:
        try:
            self._unnormalized_input(batch)
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("D101 on keras batch", error)

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
        finding = self.unnormalized.finding(message, location=batch.call_location, fix=_KERAS_FIX, evidence={
            "input_shape": list(x.shape), "dtype": x.dtype, "min": x.min, "max": x.max,
            "first_layer": leading[-1]})
        finding.first_step = self.session.step
        self.session.add_finding(finding)
