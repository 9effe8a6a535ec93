"""L108's rule, a classifier that stays at chance: a sequential test over the training batches,
pure math on plain numbers, shared by the PyTorch check and the Keras observers (imports
neither framework).

A model whose labels are independent of its inputs (inputs and labels shuffled separately, the
wrong label column) can learn the class frequencies and nothing else: on batches it has not
memorised yet, its accuracy is at most the majority-class rate and its loss at least the label
prior's entropy H(y). A model that learns leaves both. After a burn-in, every training batch
adds to one window; at looks spaced geometrically in the number of predictions, the test asks
whether the window's accuracy is significantly *below* "majority rate + δ" (Chernoff's bound on
a binomial, with the error rate α split over the looks, α_k = α / (k(k+1)), so that looking
again and again keeps the total false-alarm rate under α), and whether the window's loss is
not below H(y) (its lower confidence bound above 95% of H(y)) nor going down through it (a
significant Mann–Kendall decrease over the window whose last third lies below H(y): a correct
model that learns slowly sits near chance for a while too, but its loss keeps falling; a loss
that falls from above towards H(y) is still learning only the class frequencies). It decides at the first look where all hold: early, on batches the model has not memorised, so a model that memorises its
random labels later (the loss drifting down in later epochs) is still caught. Without
predictions (a Keras ``fit`` whose metrics give no accuracy) the loss part decides alone, with
a stricter window.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from nndoctor.loss_trend import NOT_DECREASING_Z, mann_kendall_z

BURN_IN_STEPS = 20  # the first steps learn the class frequencies: not judged
MIN_SPAN_STEPS = 50  # the window spans at least this many steps after the burn-in
MIN_BATCHES = 8
ALPHA = 0.01  # total false-alarm rate of the sequence of looks (per run)
ACCURACY_MARGIN = 0.1  # δ: "learning" means an accuracy at least this far above the majority rate
LOSS_TOLERANCE = 0.05  # the loss stays above (1 − tolerance)·H(y)
MAX_LOSS_FACTOR = 1.25  # ... and its mean below 1.25·ln(C): far above is a broken model, not chance
LOOK_GROWTH = 1.25  # the next look comes when the window holds this many times more predictions
MIN_PREDICTIONS = 256
# Without predictions the loss alone decides: a longer window.
LOSS_ONLY_MIN_SPAN_STEPS = 80
LOSS_ONLY_MIN_BATCHES = 30
_T_ONE_SIDED = 2.326  # z of a one-sided 1% bound (the batches are many: normal approximation)


@dataclass(frozen=True)
class BatchOutcome:
    """One training batch: the step, its mean loss, and (when known) how many of its ``seen``
    predictions were right."""

    step: int
    loss: float
    correct: int = -1  # -1: not known
    seen: int = 0


def entropy(counts: Sequence[float]) -> float:
    total = sum(counts)
    return -sum(c / total * math.log(c / total) for c in counts if c > 0) if total else 0.0


def bernoulli_kl(p: float, q: float) -> float:
    """KL(Bernoulli(p) ‖ Bernoulli(q))."""
    def term(a: float, b: float) -> float:
        return 0.0 if a <= 0 else a * math.log(a / b)

    q = min(max(q, 1e-12), 1 - 1e-12)
    return term(p, q) + term(1 - p, 1 - q)


def accuracy_below(correct: int, seen: int, bound: float, alpha: float) -> bool:
    """Is the accuracy significantly below ``bound``? Chernoff: P(p̂ ≤ a | p ≥ bound) ≤ exp(−n·KL(a‖bound))."""
    if seen == 0 or bound >= 1:
        return False
    rate = correct / seen
    return rate < bound and math.exp(-seen * bernoulli_kl(rate, bound)) <= alpha


def loss_lower_bound(losses: Sequence[float]) -> float:
    """One-sided 99% lower confidence bound of the mean batch loss."""
    if len(losses) < 2:
        return -math.inf
    return statistics.fmean(losses) - _T_ONE_SIDED * statistics.stdev(losses) / math.sqrt(len(losses))


def at_chance(batches: Sequence[BatchOutcome], counts: Sequence[float]) -> dict | None:
    """The evidence at the first look where the accuracy is significantly below majority + δ and the
    loss is not below H(y) (the loss alone, with a longer window, when no accuracy is known); None
    while the evidence does not suffice or the model learns."""
    classes, total = len(counts), sum(counts)
    if classes < 2 or total == 0:
        return None
    prior = entropy(counts)
    majority = max(counts) / total
    if prior <= 0:
        return None
    window = [b for b in batches if b.step >= BURN_IN_STEPS and math.isfinite(b.loss)]
    if not window:
        return None
    with_accuracy = all(b.correct >= 0 and b.seen > 0 for b in window)
    min_span = MIN_SPAN_STEPS if with_accuracy else LOSS_ONLY_MIN_SPAN_STEPS
    min_batches = MIN_BATCHES if with_accuracy else LOSS_ONLY_MIN_BATCHES
    losses: list[float] = []
    correct = seen = 0
    looks = 0
    next_look = MIN_PREDICTIONS if with_accuracy else min_batches
    for batch in window:
        losses.append(batch.loss)
        correct += max(batch.correct, 0)
        seen += batch.seen
        size = seen if with_accuracy else len(losses)
        if size < next_look or batch.step - window[0].step < min_span or len(losses) < min_batches:
            continue
        looks += 1
        next_look = math.ceil(size * LOOK_GROWTH)
        alpha = ALPHA / (looks * (looks + 1))
        low = loss_lower_bound(losses)
        if low < prior * (1 - LOSS_TOLERANCE) or statistics.fmean(losses) > MAX_LOSS_FACTOR * math.log(classes):
            continue
        if with_accuracy and not accuracy_below(correct, seen, majority + ACCURACY_MARGIN, alpha):
            continue
        trend = mann_kendall_z(losses)
        recent = statistics.median(losses[-max(1, len(losses) // 3):])
        if trend < NOT_DECREASING_Z and recent < prior:
            continue  # going down through H(y): a model that learns slowly, not labels it cannot use
        return {"from_step": window[0].step, "to_step": batch.step, "batches": len(losses),
                "predictions": seen if with_accuracy else None,
                "accuracy": round(correct / seen, 4) if with_accuracy and seen else None,
                "majority_rate": round(majority, 4), "accuracy_bound": round(majority + ACCURACY_MARGIN, 4),
                "mean_loss": round(statistics.fmean(losses), 4), "loss_lower_bound": round(low, 4),
                "prior_entropy": round(prior, 4), "ln_classes": round(math.log(classes), 4),
                "classes": classes, "looks": looks, "alpha": ALPHA, "mann_kendall_z": round(trend, 2)}
    return None


def learning(batches: Sequence[BatchOutcome], counts: Sequence[float]) -> bool:
    """The model clearly beats the majority rate over the batches after the burn-in (its accuracy
    significantly above majority + δ): the test can stop watching."""
    total = sum(counts)
    window = [b for b in batches if b.step >= BURN_IN_STEPS and b.correct >= 0]
    seen = sum(b.seen for b in window)
    if not total or seen < MIN_PREDICTIONS:
        return False
    rate = sum(b.correct for b in window) / seen
    bound = max(counts) / total + ACCURACY_MARGIN
    return rate > bound and math.exp(-seen * bernoulli_kl(rate, bound)) <= ALPHA


def chance_sentence(found: dict) -> str:
    """L108's statement of the evidence (PyTorch and Keras say it the same way)."""
    span = f"steps {found['from_step']}–{found['to_step']} ({found['batches']} batches"
    if found["accuracy"] is not None:
        accuracy = (f", {found['predictions']} predictions): accuracy {found['accuracy']:.1%}, significantly below "
                    f"the majority-class rate {found['majority_rate']:.1%} + {ACCURACY_MARGIN:.0%} (one-sided, "
                    f"α = {ALPHA:g} over {found['looks']} look{'s' if found['looks'] > 1 else ''}), and ")
    else:
        accuracy = "): "
    return (f"the classifier stayed at chance over {span}{accuracy}mean loss {found['mean_loss']:.3g} "
            f"(99% lower bound {found['loss_lower_bound']:.3g}) against the label prior's entropy "
            f"H(y) = {found['prior_entropy']:.3g} (ln {found['classes']} = {found['ln_classes']:.3g}), not going down "
            f"through it (Mann–Kendall z = {found['mann_kendall_z']:.2f}): the labels look independent of the inputs "
            f"(or the model sits on a plateau longer than {found['to_step'] - found['from_step']} steps before it "
            f"starts to learn)")


def confirmed(batches: Sequence[BatchOutcome], counts: Sequence[float], found: dict) -> bool:
    """An early decision still stands at the end of the run: the batches after it do not show a
    model that learns (accuracy significantly above majority + δ). A correct model that sat on a
    plateau and then learned withdraws it (measured: the keras-io transformer text classifier
    stays at chance for its first epoch, then learns); so does a model that memorises its random
    labels, a miss accepted to keep false alarms away."""
    return not learning([b for b in batches if b.step > found["to_step"]], counts)
