"""Step-time outliers: P114 steps far slower than the median, with what ran in them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from nndoctor.core.events import CheckpointSave, Forward, RunEnd, StepEnd
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.step_log import StepLog
from nndoctor.core.subscribers import model_forwards_only, sampled_only, sampled_training_forwards
from nndoctor.instrument.training_probe import gc_clock


@dataclass
class StepRecord:
    step: int
    seconds: float
    checkpoint_s: float = 0.0
    checkpoint_at: Location | None = None
    eval_forwards: int = 0
    eval_at: Location | None = None
    gc_s: float = 0.0
    wait_s: float = 0.0


def outlier_steps(records: list[StepRecord], *, sigmas: float = 3.0, min_ratio: float = 2.0,
                  min_steps: int = 20) -> tuple[list[StepRecord], float, float]:
    """Steps slower than median + ``sigmas`` robust standard deviations (1.4826 × MAD, which
    the outliers themselves do not inflate) and at least ``min_ratio`` × the median; with the
    median and that deviation."""
    if len(records) < min_steps:
        return [], 0.0, 0.0
    durations = [r.seconds for r in records]
    median = statistics.median(durations)
    sigma = 1.4826 * statistics.median(abs(d - median) for d in durations)
    limit = max(median + sigmas * sigma, min_ratio * median)
    return [r for r in records if r.seconds > limit], median, sigma


def outlier_cost(slow: list[StepRecord], median: float, records: list[StepRecord]) -> tuple[float, float, float]:
    """(seconds the slow steps took beyond the median step, seconds of all timed steps, the
    first's share of the second)."""
    cost = sum(max(r.seconds - median, 0.0) for r in slow)
    timed = sum(r.seconds for r in records)
    return cost, timed, (cost / timed if timed > 0 else 0.0)


@dataclass(frozen=True)
class TypicalStep:
    """What ran in the median step: a slow step is explained only by what it ran *more* of
    (a teacher forward in every step is not why one step was slow)."""

    eval_forwards: float = 0.0
    checkpoint_s: float = 0.0

    @classmethod
    def of(cls, records: list[StepRecord]) -> TypicalStep:
        if not records:
            return cls()
        return cls(statistics.median(r.eval_forwards for r in records),
                   statistics.median(r.checkpoint_s for r in records))


def explain_step(record: StepRecord, median: float,
                 typical: TypicalStep = TypicalStep()) -> tuple[str, Location | None]:
    """What ran in a slow step, largest share of the extra time first."""
    extra = max(record.seconds - median, 1e-9)
    parts: list[tuple[float, str, Location | None]] = []
    if record.checkpoint_s > typical.checkpoint_s:
        parts.append((record.checkpoint_s, f"torch.save {record.checkpoint_s * 1000:.0f} ms", record.checkpoint_at))
    if record.eval_forwards > typical.eval_forwards:
        parts.append((extra * 0.5, f"{record.eval_forwards} evaluation forward(s)", record.eval_at))
    if record.gc_s > 0.2 * extra:
        parts.append((record.gc_s, f"garbage collection {record.gc_s * 1000:.0f} ms", None))
    if record.wait_s > 0.2 * extra:
        parts.append((record.wait_s, f"waiting for data {record.wait_s * 1000:.0f} ms", None))
    if not parts:
        return "nothing nndoctor observes (host code, I/O or another process)", None
    parts.sort(key=lambda p: -p[0])
    return ", ".join(p[1] for p in parts), next((p[2] for p in parts if p[2] is not None), None)


@register
class StepTimeOutliers(Check):
    """
    ## What it does
    Times every optimizer step (from one ``optimizer.step()`` to the next: the clock read the
    step hook makes anyway, written in a row of five numbers, with no event) together with
    what ran in between: ``torch.save`` calls, evaluation
    forwards (no gradients or eval mode), time in the garbage collector, and time waiting
    for the DataLoader. nndoctor's own fully instrumented steps are left out. At the end of
    the run it reports the steps slower than the **median + 3σ** (σ estimated as 1.4826 × the
    median absolute deviation) and at least **2× the median**, with what ran in each; slow
    steps in which nothing observable ran are only counted, and alone they are not
    reported (on a shared machine they are as often noise as a cause).

    ## Why is this bad?
    Regular slow steps — a checkpoint written every N steps, an evaluation pass inside the
    training loop, a full garbage collection, a data stall at each epoch start — stretch
    wall-clock time and, in distributed training, make every other rank wait. They do not
    show in an average step time. This is information (info), not an error.

    ## Example
    ```python
    for step, (x, y) in enumerate(loader):
        ...
        if step % 50 == 0:
            torch.save(model.state_dict(), "ckpt.pt")      # blocks the step
    ```

    ## Use instead
    Checkpoint less often or asynchronously (``torch.distributed.checkpoint.async_save``),
    evaluate at epoch ends, move heavy host work out of the loop, raise DataLoader
    ``num_workers``/``prefetch_factor`` for stalls, or ``gc.freeze()`` after setup for long
    GC pauses. Thresholds follow Amazon SageMaker Debugger's ``StepOutlier`` rule (3 standard
    deviations from the mean), made robust with the median and MAD, plus 2× the median so
    that the jitter of very regular steps is not reported.

    ## References
    - Amazon SageMaker Debugger, ``StepOutlier`` profiler rule (``stddev`` = 3): https://docs.aws.amazon.com/sagemaker/latest/dg/debugger-built-in-profiler-rules.html
    - Python docs, ``gc.callbacks`` and ``gc.freeze``: https://docs.python.org/3/library/gc.html
    - PyTorch docs, ``torch.distributed.checkpoint`` (asynchronous saving): https://pytorch.org/docs/stable/distributed.checkpoint.html
    """

    code = "P114"
    name = "step-time-outliers"
    severity = Severity.INFO
    summary = "steps > 3σ slower than the median, with what ran in them — info"
    fix = "move what ran in the slow steps out of the loop, make it less frequent or asynchronous"
    needs = frozenset({"gc_clock"})
    MAX_RECORDS = 20_000
    MIN_SHARE = 0.05  # of the timed steps' wall time that the explained slow steps cost

    def __init__(self, session) -> None:
        super().__init__(session)
        # Every step's end is written by the optimizer hook (``nndoctor.core.step_log``): one
        # row a step, no event; what ran in a step (saves, evaluation forwards) is marked here.
        self._log = session.state.step_log = StepLog(self.MAX_RECORDS + 1, lambda: gc_clock(session))
        self._marks: dict[int, StepRecord] = {}  # step -> what ran in it, for the steps where something did
        self._step_at: Location | None = None

    def _mark(self, step: int) -> StepRecord:
        record = self._marks.get(step)
        if record is None:
            if len(self._marks) >= self.MAX_RECORDS:
                return StepRecord(step=step, seconds=0.0)  # not kept: a run this long has its records already
            record = self._marks[step] = StepRecord(step=step, seconds=0.0)
        return record

    def on_checkpoint_save(self, event: CheckpointSave) -> None:
        record = self._mark(event.step)
        record.checkpoint_s += event.seconds
        if record.checkpoint_at is None:
            record.checkpoint_at = event.location

    @sampled_training_forwards
    @model_forwards_only
    def on_forward(self, event: Forward) -> None:
        if event.is_loss or (event.grad_enabled and event.training):
            return
        record = self._mark(event.step)
        record.eval_forwards += 1
        if record.eval_at is None:
            record.eval_at = event.location

    @sampled_only  # the first steps are sampled: the user's optimizer.step() line is known from them
    def on_step_end(self, event: StepEnd) -> None:
        if not event.sampled or self._step_at is not None:
            return
        self._step_at = event.location

    def records(self) -> list[StepRecord]:
        """The timed steps: each step from the end of the one before, nndoctor's own fully
        instrumented steps (a sampled step, or the one right after it) left out."""
        records = []
        previous = None
        for row in self._log.rows():
            end, gc_s, wait_s, step, sampled = row
            if previous is not None and not (sampled or previous[4]):
                done = step - 1  # the step that just ended (the row holds the count after it)
                marked = self._marks.get(done)
                record = StepRecord(step=done, seconds=end - previous[0], gc_s=gc_s - previous[1],
                                    wait_s=wait_s - previous[2])
                if marked is not None:
                    record.checkpoint_s, record.checkpoint_at = marked.checkpoint_s, marked.checkpoint_at
                    record.eval_forwards, record.eval_at = marked.eval_forwards, marked.eval_at
                records.append(record)
            previous = row
        return records

    def on_run_end(self, event: RunEnd) -> None:
        records = self.records()
        slow, median, sigma = outlier_steps(records)
        if not slow:
            return
        slow.sort(key=lambda r: -r.seconds)
        typical = TypicalStep.of(records)
        explained: list[tuple[StepRecord, str]] = []
        unexplained = 0
        location = None
        for record in slow:
            what, where = explain_step(record, median, typical)
            if where is None and what.startswith("nothing"):
                unexplained += 1
                continue
            location = location or where
            explained.append((record, what))
        if not explained:
            return  # slow steps with no visible cause: machine noise as often as not
        cost, timed, share = outlier_cost([record for record, _ in explained], median, records)
        if share < self.MIN_SHARE:
            return  # real but negligible: not worth the user's attention
        described = [f"step {record.step}: {record.seconds * 1000:.0f} ms ({what})" for record, what in explained[:5]]
        if unexplained:
            described.append(f"{unexplained} more slow step(s) with nothing nndoctor observes (host code, I/O "
                             "or another process)")
        self.report(
            f"{len(slow)} of {len(records)} timed steps took more than median + 3σ "
            f"({median * 1000:.1f} ms + 3 × {sigma * 1000:.1f} ms, and at least 2× the median); those with a "
            f"visible cause cost {cost:.2f} s beyond the median step, {share:.0%} of the {timed:.2f} s the timed "
            f"steps took: " + "; ".join(described) + ".",
            location=location or self._step_at,
            evidence={"outliers": len(slow), "timed_steps": len(records), "median_ms": round(median * 1000, 3),
                      "sigma_ms": round(sigma * 1000, 3), "cost_s": round(cost, 4), "share_of_timed": round(share, 4),
                      "slowest_steps": [r.step for r in slow[:10]]},
            step=slow[0].step,
        )
