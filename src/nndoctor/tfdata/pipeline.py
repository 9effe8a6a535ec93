"""The stages of a ``tf.data.Dataset``, read from the dataset objects themselves.

A dataset built with ``ds.map(f).batch(32)`` is a chain of Python objects (``_BatchDataset``
→ ``_MapDataset`` → the source), each listing its inputs through ``_inputs()`` and keeping its
settings (``_buffer_size``, ``_num_parallel_calls``) as attributes. Walking that chain tells
which stage a slow pipeline lacks without running anything: no new iterator, no element
produced, no random number drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nndoctor.core.findings import Location

# tf.data.AUTOTUNE
AUTOTUNE = -1
# Stages that leave the samples as they are (used to tell what a shuffle shuffles).
_SOURCE_HINTS = ("TensorSlice", "Tensor", "Range", "TFRecord", "TextLine", "FixedLengthRecord",
                 "Generator", "ListFiles", "Zip")


@dataclass
class Stage:
    """One dataset object of the chain (output first)."""

    kind: str  # "map", "parallel_map", "prefetch", "cache", "shuffle", "batch", "source", …
    type_name: str
    cardinality: int | None  # elements this stage yields (None: infinite or unknown)
    buffer_size: int | None = None  # shuffle/prefetch
    num_parallel_calls: int | None = None  # parallel map/interleave/batch
    location: Location | None = None  # the user's line that built it


@dataclass
class Pipeline:
    stages: list[Stage] = field(default_factory=list)  # output first, source last

    def first(self, kind: str) -> Stage | None:
        return next((s for s in self.stages if s.kind == kind), None)

    def has(self, kind: str) -> bool:
        return self.first(kind) is not None

    @property
    def output(self) -> Stage | None:
        return self.stages[0] if self.stages else None

    @property
    def source(self) -> Stage | None:
        return self.stages[-1] if self.stages else None

    def describe(self) -> str:
        """``source → shuffle(100) → map → batch → prefetch(AUTOTUNE)``."""
        return " → ".join(_stage_text(s) for s in reversed(self.stages))

    def sequential_maps(self) -> list[Stage]:
        return [s for s in self.stages if s.kind == "map"]

    def prefetched(self) -> bool:
        """A prefetch stage after the last expensive stage (map/batch/source)."""
        for stage in self.stages:
            if stage.kind == "prefetch":
                return True
            if stage.kind in ("map", "parallel_map", "batch", "source", "interleave", "cache"):
                return False
        return False

    def elements_per_epoch(self) -> int | None:
        """Samples in one epoch: the cardinality below the first batch stage (None: unknown)."""
        below_batch = False
        for stage in self.stages:
            if below_batch and stage.kind not in ("prefetch",):
                return stage.cardinality
            if stage.kind == "batch":
                below_batch = True
        return self.source.cardinality if self.source else None


def _stage_text(stage: Stage) -> str:
    if stage.kind == "source":
        return stage.type_name.strip("_").removesuffix("Dataset") or "source"
    if stage.buffer_size is not None:
        size = "AUTOTUNE" if stage.buffer_size == AUTOTUNE else str(stage.buffer_size)
        return f"{stage.kind}({size})"
    if stage.kind == "parallel_map":
        calls = "AUTOTUNE" if stage.num_parallel_calls == AUTOTUNE else str(stage.num_parallel_calls)
        return f"map(num_parallel_calls={calls})"
    return stage.kind


def _kind(type_name: str, inputs: int) -> str:
    name = type_name.strip("_").removesuffix("Dataset")
    table = {"Map": "map", "ParallelMap": "parallel_map", "Prefetch": "prefetch", "Cache": "cache",
             "Shuffle": "shuffle", "Batch": "batch", "ParallelBatch": "batch", "PaddedBatch": "batch",
             "Repeat": "repeat", "Interleave": "interleave", "ParallelInterleave": "interleave",
             "Filter": "filter", "Take": "take", "Skip": "skip", "Options": "options",
             "Unbatch": "unbatch", "Zip": "zip", "Concatenate": "concatenate"}
    if name in table:
        return table[name]
    if inputs == 0 or name.startswith(_SOURCE_HINTS):
        return "source"
    return name.lower()


def _int(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(value.numpy()) if hasattr(value, "numpy") else int(value)
    except (TypeError, ValueError):
        return None


def _cardinality(dataset: Any) -> int | None:
    try:
        value = int(dataset.cardinality())
    except Exception:  # noqa: BLE001 - a dataset whose cardinality cannot be computed
        return None
    return value if value >= 0 else None  # -1 infinite, -2 unknown


def read_pipeline(dataset: Any, locations: Any = None, limit: int = 64) -> Pipeline:
    """The chain of ``dataset``'s stages, following each stage's first input.

    ``locations`` maps dataset objects to the user's line that built them (weak keys)."""
    stages: list[Stage] = []
    current = dataset
    while current is not None and len(stages) < limit:
        try:
            inputs = list(current._inputs())
        except Exception:  # noqa: BLE001 - a dataset type without _inputs()
            inputs = []
        type_name = type(current).__name__
        kind = _kind(type_name, len(inputs))
        location = None
        if locations is not None:
            try:
                location = locations.get(current)
            except TypeError:
                location = None
        stages.append(Stage(
            kind=kind, type_name=type_name, cardinality=_cardinality(current),
            buffer_size=_int(getattr(current, "_buffer_size", None)) if kind in ("shuffle", "prefetch") else None,
            num_parallel_calls=_int(getattr(current, "_num_parallel_calls", None)),
            location=location))
        current = inputs[0] if len(inputs) == 1 else None
    return Pipeline(stages)
