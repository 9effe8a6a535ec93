"""Classification that never leaves chance level: L108 loss-at-chance."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nndoctor.events import LossComputed, RunEnd
from nndoctor.findings import Location, Severity
from nndoctor.instrument.stats import has_plain_values
from nndoctor.registry import Check, register

BURN_IN_STEPS = 50  # early losses are near chance in every run
MIN_OBSERVATIONS = 3  # sampled steps after the burn-in
MIN_SPAN_STEPS = 200  # between the first and the last of them
LOSS_TOLERANCE = 0.05  # relative to the chance level
ACCURACY_MARGIN = 0.02


@dataclass(frozen=True)
class Observation:
    step: int
    loss: float
    correct: int
    seen: int


def entropy(counts: Sequence[float]) -> float:
    total = sum(counts)
    return -sum(c / total * math.log(c / total) for c in counts if c > 0) if total else 0.0


def at_chance(observations: Sequence[Observation], counts: Sequence[float]) -> dict | None:
    """Evidence that the loss stayed at the label prior's entropy and the accuracy at the
    majority rate over the observed window; None when the window is too short or the model
    is doing better than chance."""
    late = [o for o in observations if o.step >= BURN_IN_STEPS]
    if len(late) < MIN_OBSERVATIONS or late[-1].step - late[0].step < MIN_SPAN_STEPS:
        return None
    classes = len(counts)
    total = sum(counts)
    if classes < 2 or total == 0:
        return None
    prior_entropy = entropy(counts)
    uniform = math.log(classes)
    low = prior_entropy * (1 - LOSS_TOLERANCE)
    high = uniform * (1 + LOSS_TOLERANCE)
    if not all(low <= o.loss <= high for o in late):
        return None
    if late[-1].loss < late[0].loss - LOSS_TOLERANCE * prior_entropy:
        return None  # still going down: slow learning, not decoupled labels
    majority = max(counts) / total
    seen = sum(o.seen for o in late)
    accuracy = sum(o.correct for o in late) / seen
    noise = 3 * math.sqrt(majority * (1 - majority) / seen)
    if accuracy > majority + noise + ACCURACY_MARGIN:
        return None
    return {"losses": [round(o.loss, 4) for o in late], "steps": [o.step for o in late],
            "prior_entropy": round(prior_entropy, 4), "ln_classes": round(uniform, 4),
            "accuracy": round(accuracy, 4), "majority_rate": round(majority, 4), "classes": classes}


@register
class LossAtChance(Check):
    """
    ## What it does
    On sampled steps, for classification losses (``cross_entropy``, ``nll_loss`` with
    integer class targets, mean reduction, no label smoothing or class weights) records
    the loss, the batch accuracy of the logits' argmax, and the class counts of the
    targets. After a burn-in of 50 steps, when at least 3 sampled steps spanning at least
    200 steps all have a loss within 5% of chance — between the label prior's entropy
    H(y) (what a model that learned only the class frequencies scores) and ln(C) — the loss
    is not going down, and the accuracy is no better than always predicting the most
    frequent class (plus 3 standard errors and 2 points), it reports that the labels
    carry no information the model can use.

    ## Why is this bad?
    A classifier stuck at H(y) has learned the class frequencies and nothing else: the
    labels are decoupled from the inputs. Typical causes: inputs and labels shuffled
    separately, the label column read from the wrong field, a dataset that returns the
    label of another index, augmentations applied to the image list but not the label
    list. Training runs to the end and looks stable. L105 only looks at the first losses
    and L106 at the trend; this check names the level the loss is stuck at.

    ## Example
    ```python
    X = X[torch.randperm(len(X))]          # inputs shuffled ...
    y = y[torch.randperm(len(y))]          # ... and labels shuffled separately
    ```

    ## Use instead
    ```python
    perm = torch.randperm(len(X))
    X, y = X[perm], y[perm]                # one permutation for both
    ```
    Short runs (under ~250 steps with the default sampling) are not judged: every model
    starts at chance. A genuinely unlearnable task looks the same; so does a learning rate
    so low that nothing moves (M106 and L106 say more about that).

    ## References
    - Zhang et al., "Understanding deep learning requires rethinking generalization" (random labels), ICLR 2017: https://arxiv.org/abs/1611.03530
    - Karpathy, "A Recipe for Training Neural Networks" (verify loss @ init, input-independent baseline): https://karpathy.github.io/2019/04/25/recipe/
    """

    code = "L108"
    name = "loss-at-chance"
    severity = Severity.WARNING
    heuristic = True
    summary = "classification loss stays near ln(C) / the label prior: labels decoupled from inputs"
    fix = "check that inputs and labels are shuffled, split and indexed together (one permutation, one index)"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._observations: list[Observation] = []
        self._counts: list[float] = []
        self._location: Location | None = None
        self._last_step = -1

    def on_loss(self, event: LossComputed) -> None:
        if not event.sampled or event.step == self._last_step:
            return
        if event.function not in ("cross_entropy", "nll_loss") or not _plain_classification(event):
            return
        logits, target, output = event.input, event.target, event.output
        classes = int(logits.shape[1])
        if self._counts and len(self._counts) != classes:
            return
        ignore = event.options.get("ignore_index", -100)
        with torch.no_grad():
            keep = target != ignore
            labels = target[keep]
            if labels.numel() == 0 or int(labels.min()) < 0 or int(labels.max()) >= classes:
                return
            correct = (logits.detach()[keep].argmax(1) == labels).sum()
            counts = torch.bincount(labels, minlength=classes)
            values = torch.cat([output.detach().float().reshape(1), correct.reshape(1).float(),
                                counts.float()]).cpu().tolist()
        if not math.isfinite(values[0]):
            return
        self._last_step = event.step
        if not self._counts:
            self._counts = [0.0] * classes
            self._location = event.location
        self._counts = [a + b for a, b in zip(self._counts, values[2:])]
        self._observations.append(Observation(event.step, values[0], int(values[1]), int(labels.numel())))
        if len(self._observations) > 256:
            del self._observations[: len(self._observations) - 256]

    def on_run_end(self, event: RunEnd) -> None:
        if len(self.session.state.optimizers) > 1:
            return  # adversarial/multi-task training: losses at chance can be intended
        found = at_chance(self._observations, self._counts)
        if found is None:
            return
        self.report(
            f"the classification loss stayed at chance for {found['steps'][-1] - found['steps'][0]} steps: "
            f"{', '.join(f'{v:.3g}' for v in found['losses'][-4:])} at steps "
            f"{', '.join(str(s) for s in found['steps'][-4:])}, against the label prior's entropy "
            f"{found['prior_entropy']:.3g} (ln {found['classes']} = {found['ln_classes']:.3g}), with accuracy "
            f"{found['accuracy']:.1%} where always predicting the most frequent class gives "
            f"{found['majority_rate']:.1%}: the labels look independent of the inputs.",
            location=self._location, evidence=found, step=found["steps"][0],
        )


def _plain_classification(event: LossComputed) -> bool:
    logits, target, output = event.input, event.target, event.output
    if not (has_plain_values(logits) and has_plain_values(target) and has_plain_values(output)):
        return False
    if logits.dim() != 2 or target.dim() != 1 or logits.shape[0] != target.shape[0] or logits.shape[1] < 2:
        return False
    if target.is_floating_point() or target.dtype == torch.bool or output.numel() != 1:
        return False
    if not output.requires_grad:
        return False  # evaluation, not training
    options = event.options
    if options.get("reduction", "mean") != "mean" or options.get("weight") is not None:
        return False
    return not options.get("label_smoothing")
