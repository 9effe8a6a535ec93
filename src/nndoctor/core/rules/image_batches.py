"""Framework-free rules about image batches, shared by the PyTorch and the Keras doctors.

They read plain numbers (shape, dtype name, minimum, maximum), so the Keras doctor applies
D101 without importing the PyTorch checks (and PyTorch).
"""

from __future__ import annotations

import math
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


# Flattened images: (N, side² · channels) columns with a square side of at least this many pixels.
_MIN_FLAT_SIDE = 16


def flattened_image_side(shape: Sequence[int]) -> tuple[int, int] | None:
    """(side, channels) when a 2-D batch has as many columns as a square image of 1 or 3
    channels with a side of at least 16 pixels (784 = 28², 3072 = 32²·3), else None."""
    if len(shape) != 2:
        return None
    columns = int(shape[1])
    for channels in (1, 3):
        if columns % channels:
            continue
        side = math.isqrt(columns // channels)
        if side >= _MIN_FLAT_SIDE and side * side * channels == columns:
            return side, channels
    return None


def raw_flattened_pixels(shape: Sequence[int], dtype: str, minimum: float, maximum: float,
                         integer_valued: bool) -> str | None:
    """D101 on a 2-D batch: flattened 8-bit pixels still in 0–255, or None.

    Only when it is clearly that: as many columns as a square image, whole numbers in [0, 255]
    (uint8, or floats with integer values) and a maximum above 100 (a batch of real images has
    bright pixels; counts or small integer features rarely fill that range)."""
    if flattened_image_side(shape) is None or minimum < 0 or maximum > 255 or not integer_valued:
        return None
    if dtype == "uint8" and maximum > 1:
        return "uint8 pixels"
    return "0–255 pixels" if maximum > 100 else None
