"""K checks of ``tf.data`` input pipelines: K106 (the step waits for its input), K107 (a shuffle
buffer far below the dataset size on data that arrives in label order; ``tfdata.unshuffled``
reports D105 for a pipeline with no shuffle at all: never both).

Each check reads one ``DatasetRecord`` (fetch timings, the pipeline's stages, the first
batches' labels) from the ``DatasetIterated`` event the tf.data observer emits on the run's
session at the end of the run. Importing this module never imports TensorFlow.
"""

from __future__ import annotations

from typing import Any, ClassVar

from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register
from nndoctor.tfdata import unshuffled  # noqa: F401 - registers D105's tf.data variant
from nndoctor.tfdata.events import DatasetIterated
from nndoctor.tfdata.labels import (
    DOMINANT_SHARE,
    MIN_BATCH_SIZE,
    chance_single_class,
    ordered_evidence,
)
from nndoctor.tfdata.pipeline import Pipeline

# K106 fires when the loop waits for its input more than this share of the step time…
INPUT_BOUND_SHARE = 0.20
# …and the median step waits longer than this: below it the wait is the fixed cost of an eager
# fetch from a ready buffer (0.1–0.5 ms measured on a loaded 2-core machine), not a pipeline
# that cannot keep up. The median ignores the few slow fetches that start each epoch.
MIN_MEDIAN_WAIT_MS = 1.0
# Measured steps needed for a stable share.
MIN_MEASURED = 8
# A dataset small enough to cache in memory (bytes per epoch).
CACHE_LIMIT_BYTES = 2 << 30


# Sources that read tensors already in memory (from_tensor_slices, from_tensors, range).
_IN_MEMORY_SOURCES = {"TensorSlice", "Tensor", "Range"}


class TfDataCheck(Check):
    """A check that the tf.data observer enables on the session (``registry.framework_checks``)."""

    scope: ClassVar[str] = "tfdata"
    # The tf.data observer (``tfdata/instrument.py``) that emits ``dataset_iterated``.
    needs: ClassVar[frozenset[str]] = frozenset({"tf_datasets"})


def _at(location: Any) -> str:
    return f" (line {location})" if location else ""


def pipeline_advice(pipeline: Pipeline, epochs: int) -> list[str]:
    """What the pipeline lacks, most effective first."""
    advice = []
    for stage in pipeline.sequential_maps():
        advice.append(f"`map` at {stage.location or 'its line'} runs one element at a time: pass "
                      "num_parallel_calls=tf.data.AUTOTUNE")
    if not pipeline.prefetched():
        last = pipeline.output
        where = f" after {last.location}" if last and last.location else ""
        advice.append(f"no `prefetch` at the end of the pipeline: add .prefetch(tf.data.AUTOTUNE) as the last "
                      f"stage{where}, so the next batch is prepared while the model trains")
    if not pipeline.has("cache") and epochs >= 2 and pipeline.has("map"):
        advice.append(f"the pipeline is re-read and re-mapped every epoch ({epochs} epochs seen): add .cache() "
                      "after the deterministic map (before shuffle/augmentation) if the data fits in memory")
    return advice


@register
class TfDataInputBound(TfDataCheck):
    """The training loop waits for its ``tf.data`` input more than 20% of the step time.

    ## What it does
    Times each fetch of the next element from a ``tf.data`` iterator — a custom loop's
    ``for x, y in dataset``, Keras ``fit`` on any backend — and the time from one fetch to
    the next (one training step). Keras ``fit`` on the TensorFlow backend fetches inside its
    compiled train function: there the graph times its own fetch (two ``tf.timestamp`` ops
    around ``get_next``, read back once per epoch): every fetch of its first 1024 steps, then
    windows of 32 consecutive steps every 512 (at most 4096 timed steps per run); Python loops
    are timed on every fetch (up to 2000 steps per dataset). Fires when
    the waiting is more than 20% of the step time and the median step waits more than 1 ms
    (below that the wait is the fixed cost of a fetch from a ready buffer, 0.1–0.5 ms eagerly),
    over at least 8 measured steps (the first two fetches, which start the pipeline and trace
    the compiled step, are left out). The message gives the measured share and reads the
    pipeline's stages to say what it lacks: a final ``prefetch``, ``num_parallel_calls`` on
    ``map``, a ``cache`` for a pipeline re-read every epoch.
    Under `nndoctor perf` the same share comes from the measured window (input wait vs compute
    per step, the median step waiting at least 1 ms) and `--try prefetch,parallel-map` re-runs the
    unchanged script with each change injected, reporting the measured speed-up and the line of
    the `map` or dataset it changed.

    ## Why is this bad?
    While the model waits for data, the accelerator (or the CPU cores the model uses) is
    idle: training takes longer than it needs to, by the measured share at least. The
    TensorFlow guide shows prefetching and parallel mapping recovering most of it.

    ## Example
    ```python
    ds = tf.data.Dataset.from_tensor_slices((paths, labels))
    ds = ds.map(load_and_augment).batch(32)   # one element at a time, no prefetch
    model.fit(ds, epochs=10)
    ```

    ## Use instead
    ```python
    ds = ds.map(load_and_augment, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(32).prefetch(tf.data.AUTOTUNE)
    ```

    ## References
    - TensorFlow guide, Better performance with the tf.data API: https://www.tensorflow.org/guide/data_performance
    - tf.data.Dataset.prefetch / map(num_parallel_calls): https://www.tensorflow.org/api_docs/python/tf/data/Dataset
    - TensorFlow Profiler, input pipeline analysis ("input-bound" steps): https://www.tensorflow.org/guide/profiler
    """

    code = "K106"
    name = "tfdata-input-bound"
    severity = Severity.WARNING
    summary = "the training step waits for its tf.data input more than 20% of the time"
    fix = ("Add .prefetch(tf.data.AUTOTUNE) as the last stage, map(..., num_parallel_calls=tf.data.AUTOTUNE), "
           "and .cache() a small dataset that is re-read every epoch.")

    def on_dataset_iterated(self, event: DatasetIterated) -> None:
        record = event.record
        if record is None:
            return
        clock = record.clock
        if clock.measured < MIN_MEASURED or clock.wait_share <= INPUT_BOUND_SHARE \
                or clock.median_wait_ms < MIN_MEDIAN_WAIT_MS:
            return
        pipeline = record.pipeline
        advice = pipeline_advice(pipeline, clock.epochs)
        if not advice and pipeline.describe().split(" → ")[0] in _IN_MEMORY_SOURCES:
            # Prefetched, parallel, in-memory: nothing to change in the pipeline; the wait measured
            # is the eager fetch itself and the machine's load, not a slow source.
            return
        what = "; ".join(advice) if advice else (
            "the pipeline already prefetches and maps in parallel: the source itself is slow (read fewer, "
            "larger files, interleave(num_parallel_calls=AUTOTUNE), or cache)")
        message = (f"the training loop waited for the next tf.data batch {clock.wait_share:.0%} of the step time: "
                   f"{clock.mean_wait_ms:.1f} ms of {clock.mean_step_ms:.1f} ms per step over {clock.measured} "
                   f"steps. Pipeline: {pipeline.describe()}. {what[0].upper()}{what[1:]}.")
        self.report(message, location=record.location, evidence={
            "wait_share": round(clock.wait_share, 4), "mean_wait_ms": round(clock.mean_wait_ms, 3),
            "mean_step_ms": round(clock.mean_step_ms, 3), "median_wait_ms": round(clock.median_wait_ms, 3), "measured_steps": clock.measured,
            "epochs": clock.epochs, "pipeline": pipeline.describe(),
            "missing": [a.split(":")[0] for a in advice]})


@register
class TfDataShuffleBufferTooSmall(TfDataCheck):
    """A ``shuffle`` buffer far below the dataset size, on data that arrives in label order.

    ## What it does
    Reads the pipeline's ``shuffle(buffer_size)`` and the number of elements it shuffles;
    when the buffer is at most a tenth of them, reads the labels (``y`` of ``(x, y)``
    batches, integer or one-hot) of the first 16 batches. Fires when at least 75% of them
    are single-class (one label ≥ 90% of the batch) and they are dominated by at least two
    different labels in turn: the shuffle did not mix the classes.

    ## Why is this bad?
    ``shuffle`` keeps a buffer of ``buffer_size`` elements and draws from it at random; it
    cannot move an element further than the buffer reaches. On data stored sorted by class
    (one folder per class, a concatenation of per-class files) a buffer of 1 000 over 50 000
    images gives batches of one class in turn — the model swings towards each class and
    BatchNormalization statistics follow the last one — with nothing in the logs.

    ## Example
    ```python
    ds = tf.data.Dataset.from_tensor_slices((images, labels))  # sorted by label
    ds = ds.shuffle(100).batch(32)
    ```

    ## Use instead
    ```python
    ds = ds.shuffle(len(images)).batch(32)  # a buffer as large as the dataset
    # or shuffle the file list / the indices before reading, then a moderate buffer
    ```

    ## References
    - tf.data.Dataset.shuffle ("for perfect shuffling, a buffer size greater than or equal to the full size of the dataset is required"): https://www.tensorflow.org/api_docs/python/tf/data/Dataset#shuffle
    - Bengio, "Practical recommendations for gradient-based training of deep architectures" (2012), on shuffling: https://arxiv.org/abs/1206.5533
    """

    code = "K107"
    name = "tfdata-shuffle-buffer-too-small"
    severity = Severity.WARNING
    heuristic = True
    summary = "tf.data shuffle buffer far below the dataset size, on data ordered by label"
    fix = ("Use a shuffle buffer as large as the dataset (or shuffle the file list/indices before reading), "
           "so batches mix the classes.")

    def on_dataset_iterated(self, event: DatasetIterated) -> None:
        record = event.record
        if record is None:
            return
        from nndoctor.tfdata.instrument import small_shuffle

        small = small_shuffle(record.pipeline)
        found = ordered_evidence(record.label_batches)
        stage = record.pipeline.first("shuffle")  # there is one: small_shuffle read its buffer
        if small is None or found is None or stage is None:
            return
        buffer, elements = small
        single, usable, distinct = found
        message = (f"shuffle(buffer_size={buffer}) mixes only {buffer} of the {elements} elements at a time, and the "
                   f"data arrives ordered by label: {single} of the first {usable} batches are single-class (one "
                   f"label ≥ {DOMINANT_SHARE:.0%}), dominated by {distinct} labels in turn. Shuffled data gives "
                   f"such a batch with probability ≤ {chance_single_class(max(distinct, 2), MIN_BATCH_SIZE):.1%}.")
        self.report(message, location=stage.location or record.location, evidence={
            "buffer_size": buffer, "elements": elements, "single_class_batches": single,
            "batches": usable, "dominant_labels": distinct,
            "batch_summaries": [list(b) for b in record.label_batches]})


