"""Label order in the first batches of a pipeline (K107), from plain integer lists.

A batch is *single-class* when one label holds ≥ 90% of it. Shuffled data with C balanced
classes gives such a batch of B samples with probability C·(1/C)^B (0.8% for C = 2,
B = 8); data that is still sorted by label gives one after the other, dominated by
different labels in turn. The same rule as the PyTorch D105 check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

DOMINANT_SHARE = 0.9
MIN_BATCHES = 4
MIN_BATCH_SIZE = 8
ORDERED_SHARE = 0.75  # of the batches single-class


def batch_summary(labels: Sequence[int]) -> tuple[int, float, int]:
    """(most common label, its share, batch size)."""
    label, count = Counter(labels).most_common(1)[0]
    return label, count / len(labels), len(labels)


def ordered_evidence(batches: Sequence[tuple[int, float, int]]) -> tuple[int, int, int] | None:
    """(single-class batches, usable batches, distinct dominant labels) when the batches
    arrive in label order; None otherwise or when too few batches were seen."""
    usable = [b for b in batches if b[2] >= MIN_BATCH_SIZE]
    if len(usable) < MIN_BATCHES:
        return None
    single = [b for b in usable if b[1] >= DOMINANT_SHARE]
    distinct = len({b[0] for b in single})
    if len(single) >= ORDERED_SHARE * len(usable) and distinct >= 2:
        return len(single), len(usable), distinct
    return None


def chance_single_class(classes: int, batch_size: int) -> float:
    return classes * (1.0 / classes) ** batch_size
