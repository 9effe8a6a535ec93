"""N103's thresholds, shared by the PyTorch check and its Keras variant: a ReLU layer is dead
when at least ``DEAD_FRACTION`` of its units were never active over at least ``MIN_SAMPLES``
samples in ``MIN_BATCHES`` batches. Pure numbers (no framework)."""

from __future__ import annotations

DEAD_FRACTION = 0.9
MIN_SAMPLES = 64
MIN_BATCHES = 4
# Samples read per batch (the PyTorch check reads the first 32 of each; Keras runs batches of 32).
SAMPLES_PER_BATCH = 32


def is_dead_layer(dead: int, units: int, batches: int, samples: int) -> bool:
    """``dead`` of ``units`` never active over ``samples`` samples in ``batches`` batches: dead?"""
    return bool(units) and batches >= MIN_BATCHES and samples >= MIN_SAMPLES and dead / units >= DEAD_FRACTION
