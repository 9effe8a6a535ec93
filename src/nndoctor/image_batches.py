"""Framework-free rules about image batches, shared by the PyTorch and the Keras doctors.

They read plain numbers (shape, dtype name, minimum, maximum), so the Keras doctor applies
D101 without importing the PyTorch checks (and PyTorch).
"""

from __future__ import annotations

from collections.abc import Sequence

_IMAGE_CHANNELS = (1, 3, 4)
_MIN_SPATIAL = 8


def image_layout(shape: Sequence[int]) -> str | None:
    """``"nchw"`` or ``"nhwc"`` for a batch that looks like images, else None."""
    if len(shape) != 4:
        return None
    _, a, b, c = shape
    if a in _IMAGE_CHANNELS and b >= _MIN_SPATIAL and c >= _MIN_SPATIAL:
        return "nchw"
    if c in _IMAGE_CHANNELS and a >= _MIN_SPATIAL and b >= _MIN_SPATIAL:
        return "nhwc"
    return None


def unnormalized_pixels(dtype: str, minimum: float, maximum: float) -> str | None:
    """D101: how an image batch still is in raw pixel units, or None.

    Raw 8-bit pixels span 0–255; after ``/255`` or ``ToTensor()`` they span 0–1, after
    standardisation roughly -2.5…2.7. A non-negative batch whose maximum exceeds 25 cannot be
    either (25 is ten times the largest standardised ImageNet value).
    """
    if minimum < 0:
        return None
    if dtype == "torch.uint8" and maximum > 1:
        return "uint8 pixels"
    if maximum > 255.5:
        return "raw sensor/16-bit values"
    if maximum > 25:
        return "0–255 pixels"
    return None
