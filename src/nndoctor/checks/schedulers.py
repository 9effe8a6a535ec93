"""Learning-rate scheduler use: O107 scheduler-misuse."""

from __future__ import annotations

from typing import Any

from nndoctor.core.events import SchedulerStep
from nndoctor.core.findings import Severity
from nndoctor.core.optimizers import unwrap_optimizer
from nndoctor.core.registry import Check, register


def schedule_period(scheduler: Any) -> tuple[str, int | None]:
    """How many ``step()`` calls until an epoch-style schedule changes the LR a lot.

    Pure function of the scheduler's configuration: StepLR's ``step_size``, MultiStepLR's
    first milestone, CosineAnnealingLR's ``T_max``, and for ExponentialLR the number of
    steps until the LR falls below 1% (log 0.01 / log gamma).
    """
    import math

    kind = type(scheduler).__name__
    if kind == "StepLR":
        return kind, int(scheduler.step_size)
    if kind == "MultiStepLR":
        milestones = sorted(scheduler.milestones)
        return kind, int(milestones[0]) if milestones else None
    if kind == "CosineAnnealingLR":
        return kind, int(scheduler.T_max)
    if kind == "ExponentialLR" and 0 < scheduler.gamma < 1:
        return kind, int(math.ceil(math.log(0.01) / math.log(scheduler.gamma)))
    return kind, None


def stepped_per_batch(scheduler_steps: int, optimizer_steps: int) -> bool:
    """One scheduler step per optimizer step (within one), over at least three steps."""
    return scheduler_steps >= 3 and abs(scheduler_steps - optimizer_steps) <= 1


@register
class SchedulerMisuse(Check):
    """
    ## What it does
    Two mistakes with ``torch.optim.lr_scheduler``:

    1. ``scheduler.step()`` called before the first ``optimizer.step()``: the first value
       of the schedule is skipped.
    2. An epoch-based schedule (StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR)
       stepped once per *batch*: it is stepped as often as the optimizer, and its period
       (``step_size``, the first milestone, ``T_max``, or the steps for ExponentialLR to
       cut the LR 100×) is shorter than one epoch of the training DataLoader — so the
       milestones meant for epochs 30/60/90 all pass during epoch 1.

    ## Why is this bad?
    Case 2 is silent and severe: ``StepLR(step_size=30, gamma=0.1)`` stepped per batch on
    391 batches/epoch divides the LR by 10 thirteen times in the first epoch; training
    stops learning after a few hundred steps.

    ## Example
    ```python
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    for epoch in range(90):
        for x, y in loader:
            ...
            optimizer.step()
            scheduler.step()          # per batch, but step_size is in epochs
    ```

    ## Use instead
    ```python
    for epoch in range(90):
        for x, y in loader:
            ...
            optimizer.step()
        scheduler.step()              # once per epoch
    ```
    Schedules meant per iteration (OneCycleLR, CyclicLR, warm-up LinearLR, LambdaLR,
    CosineAnnealingLR with ``T_max`` of at least an epoch of batches) are not reported.
    A scheduler stepped before the optimizer while a GradScaler is in use is not reported
    either: the scaler legitimately skips early optimizer steps. Optimizers wrapped by
    accelerate (``AcceleratedOptimizer``, what HF Trainer's scheduler holds) or Lightning
    are resolved to the optimizer they wrap, whether the scheduler was built before or
    after ``accelerator.prepare()``.

    Both cases are errors: each changes the learning rate the run actually trains with
    (case 1 shifts the whole schedule by one step, so warm-up never applies its first
    value; PyTorch itself warns about it).

    ## References
    - PyTorch docs, "How to adjust learning rate": https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate
    - PyTorch warning "Detected call of `lr_scheduler.step()` before `optimizer.step()`" (torch/optim/lr_scheduler.py).
    """

    code = "O107"
    name = "scheduler-misuse"
    severity = Severity.ERROR
    summary = "scheduler stepped per batch while its schedule is in epochs, or stepped before optimizer.step()"
    fix = "step epoch-based schedulers once per epoch, after the epoch's optimizer steps"
    heuristic = True

    def __init__(self, session) -> None:
        super().__init__(session)
        self._counts: dict[int, int] = {}
        self._reported: set[tuple[int, str]] = set()

    def on_scheduler_step(self, event: SchedulerStep) -> None:
        if event.initial:
            return
        scheduler = event.scheduler
        key = id(scheduler)
        self._counts[key] = count = self._counts.get(key, 0) + 1
        optimizer = getattr(scheduler, "optimizer", None)
        if optimizer is None:
            return
        optimizer = unwrap_optimizer(optimizer)  # accelerate's AcceleratedOptimizer, Lightning's
        state = self.session.state
        # A wrapper (accelerate's AcceleratedOptimizer under the 🤗 Trainer) is not the object
        # whose step() is counted: the optimizer it wraps is, in its .optimizer.
        while optimizer not in state.step_counts and getattr(optimizer, "optimizer", None) is not None:
            optimizer = optimizer.optimizer
        opt_steps = state.step_counts.get(optimizer, 0)
        if count == 1 and opt_steps == 0 and state.scaler is None and (key, "early") not in self._reported:
            self._reported.add((key, "early"))
            self.report(
                f"{type(scheduler).__name__}.step() was called before the first optimizer.step(): "
                "the first learning-rate value of the schedule is skipped.",
                location=event.location, evidence={"scheduler": type(scheduler).__name__},
                fix="call scheduler.step() after optimizer.step()", step=event.step,
            )
        if (key, "per-batch") in self._reported or not stepped_per_batch(count, opt_steps):
            return
        kind, period = schedule_period(scheduler)
        lengths = [n for n in state.loader_lengths.values() if n]
        if period is None or not lengths:
            return
        per_epoch = max(lengths)
        if count >= period and period < per_epoch and opt_steps <= per_epoch:
            self._reported.add((key, "per-batch"))
            before = event.lr_before[0] if event.lr_before else None
            after = event.lr_after[0] if event.lr_after else None
            self.report(
                f"{kind} is stepped after every batch ({count} scheduler steps for {opt_steps} optimizer "
                f"steps) but its period is {period} steps while one epoch has {per_epoch} batches: the "
                f"schedule meant for epochs already changed the LR inside epoch 1 (lr now {after:.3g}).",
                location=event.location,
                evidence={"scheduler": kind, "period_steps": period, "batches_per_epoch": per_epoch,
                          "scheduler_steps": count, "optimizer_steps": opt_steps,
                          "lr_before": before, "lr_now": after},
                step=event.step,
            )
