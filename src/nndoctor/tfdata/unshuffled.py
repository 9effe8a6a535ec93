"""D105 (the PyTorch code for unshuffled training data) on a ``tf.data`` pipeline with no
``shuffle`` at all whose training batches arrive in label order. K107 covers a pipeline that
shuffles with too small a buffer, so one pipeline never gets both. A variant of the PyTorch
check: one catalog entry, read from the catalog table (no PyTorch import).
"""

from __future__ import annotations

from typing import Any, ClassVar

from nndoctor.core.registry import Check, register_variant
from nndoctor.tfdata.events import DatasetIterated
from nndoctor.tfdata.labels import (
    DOMINANT_SHARE,
    MIN_BATCH_SIZE,
    chance_single_class,
    ordered_evidence,
)


def training_batches(record: Any, final_step: int) -> list[tuple[int, float, int]]:
    """The label summaries of the batches followed by an optimizer step before the next fetch
    (or before the end of the run, for the last one read): a validation pass fetches without stepping."""
    following = [*record.label_steps[1:], final_step]
    return [summary for summary, step, after in zip(record.label_batches, record.label_steps, following, strict=True)
            if after > step]


@register_variant
class UnshuffledPipeline(Check):
    """D105 on a tf.data pipeline with no ``shuffle`` whose training batches arrive in label order."""

    code = "D105"
    scope: ClassVar[str] = "tfdata"
    needs: ClassVar[frozenset[str]] = frozenset({"tf_datasets"})

    def on_dataset_iterated(self, event: DatasetIterated) -> None:
        record, session = event.record, self.session
        if record is None or record.pipeline.has("shuffle") or not record.label_batches or session.step <= 0:
            return
        batches = training_batches(record, session.step)
        found = ordered_evidence(batches)
        if found is None:
            return
        single, usable, distinct = found
        batch = record.pipeline.first("batch")
        message = (f"the tf.data pipeline {record.pipeline.describe()} has no shuffle, and its training batches "
                   f"arrive in label order: {single} of the first {usable} are single-class (one label ≥ "
                   f"{DOMINANT_SHARE:.0%}), dominated by {distinct} different labels in turn. Shuffled data gives "
                   f"such a batch with probability ≤ {chance_single_class(max(distinct, 2), MIN_BATCH_SIZE):.1%}.")
        self.report(message, location=(batch.location if batch else None) or record.location, evidence={
            "pipeline": record.pipeline.describe(), "single_class_batches": single, "batches": usable,
            "dominant_labels": distinct, "batch_summaries": [list(b) for b in batches]},
            fix="add .shuffle(buffer_size) before .batch(), with a buffer as large as the dataset for data stored "
                "sorted by class (or shuffle the file list/indices first)", step=0)
