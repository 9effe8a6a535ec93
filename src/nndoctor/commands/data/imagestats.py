"""Pure functions over decoded pixels: perceptual hash, channel moments, blankness.

Kept free of file handling so the math is unit-testable on plain arrays.
"""

from __future__ import annotations

import functools

import numpy as np

PHASH_SIZE = 32  # the image is reduced to 32×32 before the DCT (as in imagehash.phash)
PHASH_LOW = 8  # the 8×8 lowest frequencies give the 64 bits


@functools.lru_cache(maxsize=1)
def _dct_matrix(n: int = PHASH_SIZE) -> np.ndarray:
    """Orthonormal DCT-II basis, so ``M @ x @ M.T`` is the 2-D DCT of an n×n block."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    matrix = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    matrix[0] /= np.sqrt(2.0)
    return matrix


def phash(gray32: np.ndarray) -> int:
    """64-bit perceptual hash of a 32×32 grayscale image, as a signed int (fits SQLite).

    Bits are the 8×8 lowest DCT coefficients compared with their median: resizing,
    re-encoding and mild colour changes move only a few bits, unrelated images differ in ~32.
    """
    matrix = _dct_matrix()
    coefficients = matrix @ gray32.astype(np.float64) @ matrix.T
    low = coefficients[:PHASH_LOW, :PHASH_LOW].ravel()
    bits = low > np.median(low)
    value = 0
    for bit in bits:
        value = (value << 1) | int(bit)
    return value - (1 << 64) if value >= (1 << 63) else value


def hamming(a: int, b: int) -> int:
    return ((a ^ b) & 0xFFFFFFFFFFFFFFFF).bit_count()


_LEVELS = np.arange(256, dtype=np.float64)


def channel_moments(histogram: list[int]) -> list[float]:
    """Per-channel mean and mean of squares, on the 0–1 scale, from a 768-bin RGB histogram.

    Averaging these per-image moments over images and taking sqrt(E[x²] − E[x]²) gives the
    dataset's per-channel std with every image weighted equally, which is what a loader that
    resizes images to one size sees. Pillow's C histogram makes this ~50× cheaper than numpy
    reductions over the pixels.
    """
    counts = np.asarray(histogram, dtype=np.float64).reshape(3, 256)
    total = counts.sum(axis=1)
    total[total == 0] = 1.0
    levels = _LEVELS / 255.0
    means = counts @ levels / total
    squares = counts @ (levels * levels) / total
    return [float(v) for v in means] + [float(v) for v in squares]


def gray_std(histogram: list[int]) -> float:
    """Standard deviation of grayscale pixels on the 0–255 scale, from a 256-bin histogram."""
    counts = np.asarray(histogram, dtype=np.float64)
    total = counts.sum() or 1.0
    mean = counts @ _LEVELS / total
    return float(np.sqrt(max(counts @ (_LEVELS * _LEVELS) / total - mean * mean, 0.0)))
