"""Evaluation passes: P112 evaluation that builds autograd graphs, L107 overfitting."""

from __future__ import annotations

import math
from typing import Any

import torch

from nndoctor.core.events import Backward, EpochStart, Forward, LossComputed, ModeChange, RunEnd
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import (
    model_forwards_only,
    sampled_training_forwards,
    sampled_training_losses,
)
from nndoctor.instrument.loss_ledger import LossLedger, loss_ledger
from nndoctor.instrument.stats import first_tensor


@register
class EvalBuildsGraphs(Check):
    """
    ## What it does
    Follows the forwards of a model in **eval mode** (``model.eval()``) run with gradients
    enabled (no ``torch.no_grad()`` / ``torch.inference_mode()``) whose output requires
    grad. Such a forward is *evaluation* when no ``backward()`` follows it before the model
    goes back to training (``model.train()``), the loader starts a new pass, or the run ends.
    It reports once at least 4 such evaluation forwards were seen, with their share of all
    evaluation forwards (eval mode, no backward) and the size of their outputs.

    ## Why is this bad?
    With gradients enabled every forward records an autograd graph and keeps every
    intermediate activation needed for a backward that never comes. Evaluation then uses
    several times the memory it needs (out-of-memory errors "only during validation", or a
    batch size that must be lowered for evaluation) and runs slower than under
    ``inference_mode``, which also skips version-counter bookkeeping. Keeping outputs or
    losses of such forwards (``val_losses.append(loss)``) keeps whole graphs alive.

    ## Example
    ```python
    model.eval()
    for x, y in val_loader:
        total += criterion(model(x), y).item()
    ```

    ## Use instead
    ```python
    model.eval()
    with torch.inference_mode():          # or torch.no_grad()
        for x, y in val_loader:
            total += criterion(model(x), y).item()
    ```
    Forwards in eval mode followed by a backward (fine-tuning with frozen BatchNorm,
    adversarial examples, saliency maps) are training, not evaluation, and are not counted.
    Threshold: 4 evaluation forwards, so a single probe call does not fire.

    ## References
    - PyTorch docs, ``torch.no_grad`` / ``torch.inference_mode`` ("Locally disabling gradient computation"): https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation
    - PyTorch docs, ``torch.inference_mode``: https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html
    - PyTorch Performance Tuning Guide (disable gradient calculation for validation or inference): https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    """

    code = "P112"
    name = "eval-builds-graphs"
    severity = Severity.WARNING
    summary = "evaluation forwards with grad enabled (no no_grad/inference_mode)"
    fix = "wrap evaluation in `with torch.inference_mode():` (or torch.no_grad())"
    MIN_FORWARDS = 4
    # Armed while eval-mode forwards with grad wait for the verdict: a backward clears them.
    idle_handlers = ("backward",)

    def __init__(self, session) -> None:
        super().__init__(session)
        self._pending: list[tuple[int, Location | None, int, str]] = []  # step, where, output bytes, model
        self._with_grad: list[tuple[int, Location | None, int, str]] = []
        self._without_grad = 0
        self._reported = False

    @sampled_training_forwards
    @model_forwards_only
    def on_forward(self, event: Forward) -> None:
        if self._reported or event.is_loss or event.training:
            return
        if not event.grad_enabled or event.inference_mode:
            self._without_grad += 1
            return
        out = first_tensor(event.output)
        if out is None or not out.requires_grad:
            return  # a frozen model: nothing recorded
        self._pending.append((event.step, event.location, out.numel() * out.element_size(),
                              type(event.module).__name__))
        if len(self._pending) == 1:
            self.session.arm(self, "backward")
        if len(self._pending) > 10_000:
            del self._pending[:5_000]

    def on_backward(self, event: Backward) -> None:
        self._pending.clear()  # the eval-mode forwards fed a backward: training
        self.session.disarm(self, "backward")

    def on_mode_change(self, event: ModeChange) -> None:
        if event.training:
            self._conclude(event.step)

    def on_epoch_start(self, event: EpochStart) -> None:
        self._conclude(event.step)

    def on_run_end(self, event: RunEnd) -> None:
        self._conclude(event.step)

    def _conclude(self, step: int) -> None:
        if self._reported or not self._pending:
            return
        self._with_grad.extend(self._pending)
        self._pending = []
        if len(self._with_grad) < self.MIN_FORWARDS:
            return
        self._reported = True
        count = len(self._with_grad)
        share = count / (count + self._without_grad)
        first_step, where, _, model = self._with_grad[0]
        output_bytes = sum(entry[2] for entry in self._with_grad)
        megabytes = output_bytes / 2**20
        size = f"{megabytes:.1f} MB" if megabytes >= 0.1 else f"{output_bytes / 1024:.1f} KB"
        self.report(
            f"{count} evaluation forwards of {model} (eval mode, no backward after them) ran with gradients "
            f"enabled — {share:.0%} of the {count + self._without_grad} evaluation forwards seen: each built an "
            f"autograd graph and kept its activations for a backward that never came (outputs alone: "
            f"{size}, the saved activations are several times more).",
            location=where,
            evidence={"evaluation_forwards_with_grad": count, "evaluation_forwards_without_grad": self._without_grad,
                      "share": round(share, 4), "output_megabytes": round(megabytes, 3), "model": model},
            step=first_step,
        )


def overfitting_verdict(history: list[tuple[float, float]], *, rises: int = 3,
                        min_rise: float = 0.1) -> dict[str, Any] | None:
    """Evidence of overfitting in ``(train_loss, eval_loss)`` per evaluation, oldest first:
    the evaluation loss rose at each of the last ``rises`` evaluations, by ``min_rise``
    (relative) above its best, while the training loss fell over the same evaluations."""
    if len(history) < rises + 1:
        return None
    window = history[-(rises + 1):]
    evals = [e for _, e in window]
    trains = [t for t, _ in window]
    if not all(math.isfinite(v) for v in evals + trains):
        return None
    if any(later <= earlier for earlier, later in zip(evals, evals[1:])):
        return None
    best = min(e for _, e in history)
    if best <= 0 or (evals[-1] - best) / best < min_rise:
        return None
    if trains[-1] >= trains[0]:
        return None
    return {"eval_losses": [round(e, 6) for e in evals], "train_losses": [round(t, 6) for t in trains],
            "best_eval_loss": round(best, 6), "rise_above_best": round((evals[-1] - best) / best, 4)}


class _LossSum:
    """A running sum of scalar losses read through the session's loss ledger (each loss read
    once for L106, L107, L108 and N101): a CPU loss is added at once, a CUDA loss's value once
    its copy to the host has landed — no synchronisation but when the mean is read, once per
    evaluation."""

    _FOLD_AT = 256  # CUDA losses waiting: the landed ones are added, without waiting

    def __init__(self, ledger: LossLedger) -> None:
        self._ledger = ledger
        self._pending: list[int] = []  # serials of losses not added yet (CUDA copies in flight)
        self.host_total = 0.0
        self.count = 0

    def add(self, loss: torch.Tensor) -> None:
        serial, value = self._ledger.read(loss)
        self.count += 1
        if value is not None and not self._pending:  # a CPU loss: read already
            self.host_total += value
            return
        self._pending.append(serial)
        if len(self._pending) >= self._FOLD_AT:
            self._fold(wait=False)

    def _fold(self, *, wait: bool) -> None:
        """Add the pending losses in order: all of them (waiting), or those landed already."""
        ledger, added = self._ledger, 0
        values = ledger.values(self._pending) if wait else [ledger.landed(s) for s in self._pending]
        for serial, value in zip(self._pending, values, strict=True):
            if value is None:
                if not wait and serial >= ledger.oldest:
                    break  # still in flight
                self.count -= 1  # dropped by the ledger: not in the mean
            else:
                self.host_total += value
            added += 1
        del self._pending[:added]

    def mean_and_reset(self) -> float | None:
        if self._pending:
            self._fold(wait=True)
        if not self.count:
            return None
        mean = self.host_total / self.count
        self.host_total, self.count = 0.0, 0
        return mean


@register
class Overfitting(Check):
    """
    ## What it does
    Averages the losses given to ``backward()`` (training) and the scalar losses computed
    **without** gradients (evaluation, under ``no_grad``/``inference_mode``) between
    evaluations: each run of at
    least 2 consecutive evaluation losses is one evaluation (a single loss computed under
    ``no_grad`` between training steps is a logged metric, not an evaluation). A GPU loss reaches the
    host without a synchronisation; the sums are read once per evaluation. It reports when the evaluation loss rose at each of the last
    **3 evaluations**, ends **≥ 10%** above its best value, and the training loss fell over
    the same evaluations.

    ## Why is this bad?
    A falling training loss with a rising validation loss means the model has started to
    memorise the training set: every further epoch makes it worse on new data while the
    training curve looks better. Without early stopping or a best-checkpoint rule the final
    weights are worse than those of several epochs ago.

    ## Example
    ```python
    for epoch in range(200):                       # far past the best epoch
        train_one_epoch(model, train_loader)
        validate(model, val_loader)                # the loss has risen for 3 epochs
    ```

    ## Use instead
    Keep the checkpoint with the best validation loss and stop when it no longer improves
    (early stopping), add regularisation (weight decay, dropout, data augmentation), or
    get more data / use a smaller model. Thresholds: 3 consecutive rises ending 10% above
    the best. Amazon SageMaker Debugger's ``Overfit`` rule instead fires as soon as
    (validation − training) / training exceeds 0.1 for one step; that fires on any
    generalisation gap, which most well-trained models have, so nndoctor waits for the
    trend.

    ## References
    - Amazon SageMaker Debugger, ``Overfit`` rule (``ratio_threshold`` 0.1, ``patience`` 1): https://docs.aws.amazon.com/sagemaker/latest/dg/overfit.html
    - Goodfellow, Bengio & Courville, *Deep Learning*, §7.8 "Early Stopping": https://www.deeplearningbook.org/contents/regularization.html
    - PyTorch Lightning docs, ``EarlyStopping`` callback: https://lightning.ai/docs/pytorch/stable/common/early_stopping.html
    """

    code = "L107"
    name = "overfitting"
    severity = Severity.WARNING
    summary = "evaluation loss rising while training loss falls"
    fix = "keep the best-validation checkpoint and stop early, or regularise (weight decay, dropout, augmentation)"
    MAX_HISTORY = 1000
    MIN_EVAL_LOSSES = 2

    idle_handlers = ("backward",)  # armed by an evaluation's losses: the next backward() ends it

    def __init__(self, session) -> None:
        super().__init__(session)
        # The training losses are the losses given to backward(): the backward hook records
        # each of them in the loss ledger (no handler call a step), read when an evaluation ends.
        self._ledger = loss_ledger(session, follow_backward=True)
        self._train_cursor = self._ledger.backward_count
        self._eval = _LossSum(self._ledger)
        self._eval_where: Location | None = None
        self._history: list[tuple[float, float]] = []
        self._last_train: float | None = None
        self._reported = False

    @sampled_training_losses
    def on_loss(self, event: LossComputed) -> None:
        loss = event.output
        if self._reported or (type(loss) is not torch.Tensor and not isinstance(loss, torch.Tensor)) \
                or (loss.ndim and loss.numel() != 1) or not loss.dtype.is_floating_point:  # a 0-d loss: no calls
            return
        if loss.requires_grad:  # a training loss (a sampled step's): an evaluation before it has ended
            if self._eval.count:
                self._conclude_evaluation(event.step)
        elif not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            if self._eval.count == 0:
                self._eval_where = event.location
                self.session.arm(self, "backward")
            self._eval.add(loss)

    def on_backward(self, event: Backward) -> None:
        """The first backward() after an evaluation's losses: the evaluation has ended."""
        self.session.disarm(self, "backward")
        if self._eval.count and not self._reported:
            self._conclude_evaluation(event.step, training_until=self._ledger.backward_count - 1)

    def on_run_end(self, event: RunEnd) -> None:
        if self._eval.count and not self._reported:
            self._conclude_evaluation(event.step)

    def _training_mean(self, until: int | None) -> float | None:
        """The mean of the losses given to backward() since the last evaluation ended (up to
        the ``until``-th: the one the ending backward() call brought is the next period's)."""
        self._train_cursor, values = self._ledger.backward_values(self._train_cursor, until)
        return sum(values) / len(values) if values else None

    def _conclude_evaluation(self, step: int, training_until: int | None = None) -> None:
        if self._eval.count < self.MIN_EVAL_LOSSES:
            # One loss without gradients between training steps is a metric logged under
            # no_grad (or a teacher's loss), not an evaluation pass.
            self._eval = _LossSum(self._ledger)
            return
        eval_mean = self._eval.mean_and_reset()
        train_mean = self._training_mean(training_until)
        if train_mean is None:
            train_mean = self._last_train  # two evaluations in a row: same training loss
        if eval_mean is None or train_mean is None:
            return
        self._last_train = train_mean
        self._history.append((train_mean, eval_mean))
        del self._history[:-self.MAX_HISTORY]
        verdict = overfitting_verdict(self._history)
        if verdict is None:
            return
        self._reported = True
        evals, trains = verdict["eval_losses"], verdict["train_losses"]
        self.report(
            f"The evaluation loss rose at each of the last {len(evals) - 1} evaluations "
            f"({' → '.join(f'{v:.4g}' for v in evals)}), now {verdict['rise_above_best']:.0%} above its best "
            f"({verdict['best_eval_loss']:.4g}), while the training loss fell ({' → '.join(f'{v:.4g}' for v in trains)}): "
            "the model is overfitting the training data.",
            location=self._eval_where,
            evidence={**verdict, "evaluations": len(self._history)},
            step=step,
        )
