"""The names that mark a split (folder names, file-name words, array names)."""

from __future__ import annotations

SPLIT_NAMES = frozenset(
    ("train", "training", "val", "valid", "validation", "test", "testing", "dev", "eval", "holdout")
)
TRAIN_NAMES = frozenset(("train", "training"))
