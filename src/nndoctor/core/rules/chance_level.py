"""L108's rule, a classifier that stays at chance: a sequential test over the training batches,
pure math on plain numbers, shared by the PyTorch check and the Keras observers (imports
neither framework).

A model whose labels are independent of its inputs (inputs and labels shuffled separately, the
wrong label column) can learn the class frequencies and nothing else: on a batch it has not
been trained on yet, its expected accuracy is at most the majority-class rate and its expected
loss at least the label prior's entropy H(y), whatever the model (its prediction does not depend
on the label). A model that learns leaves both. Later passes over the same samples let a large
model memorise its random labels (Zhang et al. 2017), so when the batches' pass over the
training data is known the test looks only at the first ``DECISION_PASSES`` passes: the first
(progressive validation: every prediction comes before the model is trained on that sample) and
the second, where a sample has been trained on once, many steps before (fitting random labels
takes many passes: measured, a tiny BERT on 128 shuffled labels stays at the majority rate
through its second pass and memorises from the third). Without a DataLoader (tensors sliced by
hand, Keras ``fit``) every batch counts as new: a model that memorises only makes the test fire
later, or not at all.

After a burn-in, every judged batch adds to one window; at looks spaced geometrically in the
number of predictions (and once more when the window is complete), the test asks whether the
window's accuracy is significantly *below* "majority rate + δ" (the exact binomial tail, which
also bounds predictions whose success rates vary (Hoeffding 1956); the error rate α split over
the looks, α_k = α / (k(k+1)), so that looking again and again keeps the total false-alarm
rate under α), and whether the window's loss is not below H(y) (its lower confidence bound
above 95% of H(y)) nor going down through it (a significant Mann–Kendall decrease over the
window whose last third lies below H(y): a correct model that learns slowly sits near chance
for a while too, but its loss keeps falling; a loss that falls from above towards H(y) is still
learning only the class frequencies). It decides at the first look where all hold. Without
predictions (a Keras ``fit`` whose metrics give no accuracy) the loss part decides alone, with
a stricter window.

The decision stands at the end of the run unless the model is seen learning (``confirmed``):
held-out evaluations above the majority rate (which labels independent of the inputs cannot
give, memorised or not), or, without a conclusive evaluation, training accuracy significantly
above majority + δ after the decision.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from nndoctor.core.rules.loss_trend import NOT_DECREASING_Z, mann_kendall_z

BURN_IN_STEPS = 20  # the first steps learn the class frequencies: not judged
BURN_IN_SHARE = 4  # ... at most a quarter of the first pass, when passes are known
DECISION_PASSES = 2  # passes over the training data judged: each sample trained on at most once before
MIN_SPAN_STEPS = 50  # the window spans at least this many steps after the burn-in (or all the decision passes)
MIN_BATCHES = 8
ALPHA = 0.01  # total false-alarm rate of the sequence of looks (per run)
HELD_OUT_ALPHA = 0.05  # a report withdrawn on held-out accuracy above the majority rate: at most 5% of real bugs
ACCURACY_MARGIN = 0.1  # δ: "learning" means an accuracy at least this far above the majority rate
LOSS_TOLERANCE = 0.05  # the loss stays above (1 − tolerance)·H(y)
MAX_LOSS_FACTOR = 1.25  # ... and its mean below 1.25·ln(C): far above is a broken model, not chance
LOOK_GROWTH = 1.25  # the next look comes when the window holds this many times more predictions
MIN_PREDICTIONS = 256
MIN_PASS_PREDICTIONS = 128  # with passes known, the window ends with the second pass: a small dataset may give no more
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
    visit: int = -1  # the training pass over its data the batch came from (0: the first); -1: not known


@dataclass(frozen=True)
class Evaluation:
    """One evaluation pass on held-out data (classification losses without a gradient at one
    step): how many of its ``seen`` predictions were right, and its targets' class counts."""

    step: int
    correct: int
    seen: int
    counts: tuple[float, ...] = ()

    @property
    def majority_rate(self) -> float:
        total = sum(self.counts)
        return max(self.counts) / total if total else 0.0


def entropy(counts: Sequence[float]) -> float:
    total = sum(counts)
    return -sum(c / total * math.log(c / total) for c in counts if c > 0) if total else 0.0


def bernoulli_kl(p: float, q: float) -> float:
    """KL(Bernoulli(p) ‖ Bernoulli(q))."""
    def term(a: float, b: float) -> float:
        return 0.0 if a <= 0 else a * math.log(a / b)

    q = min(max(q, 1e-12), 1 - 1e-12)
    return term(p, q) + term(1 - p, 1 - q)


def binomial_tail(successes: int, trials: int, rate: float, *, upper: bool = False) -> float:
    """P(X ≤ successes) (or P(X ≥ successes) with ``upper``) for X ~ Binomial(trials, rate), summed
    in log space from ``successes`` away from the mean (where the terms only fall) until they no
    longer matter; a tail that holds the mean is one minus the other tail."""
    if trials <= 0:
        return 1.0
    if rate <= 0 or rate >= 1:
        inside = (successes >= trials * rate) if not upper else (successes <= trials * rate)
        return 1.0 if inside else 0.0
    mean = trials * rate
    if not upper and successes >= mean:  # the terms would grow towards the mode: take the complement
        return max(0.0, 1.0 - binomial_tail(successes + 1, trials, rate, upper=True))
    if upper and successes <= mean:
        return max(0.0, 1.0 - binomial_tail(successes - 1, trials, rate))
    if successes < 0 or successes > trials:
        return 0.0
    log_p, log_q = math.log(rate), math.log1p(-rate)
    lgamma_n = math.lgamma(trials + 1)

    def log_term(k: int) -> float:
        return lgamma_n - math.lgamma(k + 1) - math.lgamma(trials - k + 1) + k * log_p + (trials - k) * log_q

    ks = range(successes, trials + 1) if upper else range(successes, -1, -1)
    total, first = 0.0, None
    for k in ks:
        term = log_term(k)
        if first is None:
            first = term
        total += math.exp(term - first)
        if term - first < -40:  # the terms fall geometrically away from the mean
            break
    return min(1.0, math.exp(first + math.log(total))) if first is not None else 0.0


def accuracy_below(correct: int, seen: int, bound: float, alpha: float) -> bool:
    """Is the accuracy significantly below ``bound``? The exact binomial lower tail at ``bound``,
    which also bounds a sum of predictions with varying success rates of mean ≥ ``bound``."""
    if seen == 0 or bound >= 1 or correct >= seen * bound:
        return False
    return binomial_tail(correct, seen, bound) <= alpha


def accuracy_above(correct: int, seen: int, bound: float, alpha: float) -> bool:
    """Is the accuracy significantly above ``bound``? (The upper binomial tail.)"""
    if seen == 0 or bound >= 1 or correct <= seen * bound:
        return False
    return binomial_tail(correct, seen, bound, upper=True) <= alpha


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
    window, complete = decision_window(batches)
    if not window:
        return None
    with_accuracy = all(b.correct >= 0 and b.seen > 0 for b in window)
    min_span = MIN_SPAN_STEPS if with_accuracy else LOSS_ONLY_MIN_SPAN_STEPS
    min_batches = MIN_BATCHES if with_accuracy else LOSS_ONLY_MIN_BATCHES
    min_predictions = MIN_PASS_PREDICTIONS if passes_of(window) is not None else MIN_PREDICTIONS
    min_size = min_predictions if with_accuracy else min_batches
    losses: list[float] = []
    correct = seen = 0
    looks = 0
    next_look = min_size
    for index, batch in enumerate(window):
        losses.append(batch.loss)
        correct += max(batch.correct, 0)
        seen += batch.seen
        size = seen if with_accuracy else len(losses)
        last = complete and index == len(window) - 1  # the decision passes are over: one more look
        if len(losses) < min_batches or size < min_size:
            continue
        if not last and (size < next_look or batch.step - window[0].step < min_span):
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
        passes = passes_of(window[: index + 1])
        return {"from_step": window[0].step, "to_step": batch.step, "batches": len(losses),
                **({"passes": passes} if passes else {}),
                "predictions": seen if with_accuracy else None,
                "accuracy": round(correct / seen, 4) if with_accuracy and seen else None,
                "majority_rate": round(majority, 4), "accuracy_bound": round(majority + ACCURACY_MARGIN, 4),
                "mean_loss": round(statistics.fmean(losses), 4), "loss_lower_bound": round(low, 4),
                "prior_entropy": round(prior, 4), "ln_classes": round(math.log(classes), 4),
                "classes": classes, "looks": looks, "alpha": ALPHA, "mann_kendall_z": round(trend, 2)}
    return None


def decision_window(batches: Sequence[BatchOutcome]) -> tuple[list[BatchOutcome], bool]:
    """The batches the test judges, and whether that window is complete (no more will come).

    Passes known: the batches of the first ``DECISION_PASSES`` passes after a burn-in of at most a
    quarter of the first pass (a small dataset's first pass may be a dozen steps); complete once
    a later pass has begun. Passes not known: every batch after the burn-in, never complete."""
    finite = [b for b in batches if math.isfinite(b.loss)]
    if not any(b.visit >= 0 for b in finite):
        return [b for b in finite if b.step >= BURN_IN_STEPS], False
    first_pass = sum(1 for b in finite if b.visit <= 0)
    start = (finite[0].step if finite else 0) + min(BURN_IN_STEPS, first_pass // BURN_IN_SHARE)
    window = [b for b in finite if b.step >= start and b.visit < DECISION_PASSES]
    return window, any(b.visit >= DECISION_PASSES for b in finite)


def passes_of(window: Sequence[BatchOutcome]) -> int | None:
    """How many passes over the DataLoader the window covers (None: not known)."""
    visits = {b.visit for b in window if b.visit >= 0}
    return len(visits) if visits else None


def learning(batches: Sequence[BatchOutcome], counts: Sequence[float]) -> bool:
    """The model clearly beats the majority rate over the judged batches (its accuracy
    significantly above majority + δ): the test can stop watching."""
    total = sum(counts)
    window = [b for b in decision_window(batches)[0] if b.correct >= 0]
    seen = sum(b.seen for b in window)
    if not total or seen < MIN_PREDICTIONS:
        return False
    return accuracy_above(sum(b.correct for b in window), seen, max(counts) / total + ACCURACY_MARGIN, ALPHA)


def undecidable(batches: Sequence[BatchOutcome]) -> bool:
    """The decision passes are over: later batches may be memorised, the test has nothing more to judge."""
    return decision_window(batches)[1]


def chance_sentence(found: dict) -> str:
    """L108's statement of the evidence (PyTorch and Keras say it the same way)."""
    span = f"steps {found['from_step']}–{found['to_step']} ("
    passes = found.get("passes")
    if passes:
        span += (f"its first {passes} passes over the training data, before it could memorise the labels: " if passes > 1
                 else "its first pass over the training data, batches it had not been trained on: ")
    span += f"{found['batches']} batches"
    if found["accuracy"] is not None:
        accuracy = (f", {found['predictions']} predictions): accuracy {found['accuracy']:.1%}, significantly below "
                    f"{found['accuracy_bound']:.1%} (the majority-class rate {found['majority_rate']:.1%} + "
                    f"{ACCURACY_MARGIN * 100:.0f} points; one-sided, α = {ALPHA:g} over {found['looks']} "
                    f"look{'s' if found['looks'] > 1 else ''}), and ")
    else:
        accuracy = "): "
    return (f"the classifier stayed at chance over {span}{accuracy}mean loss {found['mean_loss']:.3g} "
            f"(99% lower bound {found['loss_lower_bound']:.3g}) against the label prior's entropy "
            f"H(y) = {found['prior_entropy']:.3g} (ln {found['classes']} = {found['ln_classes']:.3g}), not going down "
            f"through it (Mann–Kendall z = {found['mann_kendall_z']:.2f}): the labels look independent of the inputs"
            + _held_out_clause(found))


def _held_out_clause(found: dict) -> str:
    if found.get("held_out_predictions"):
        return (f"; evaluations on held-out data after it stay at chance too (accuracy {found['held_out_accuracy']:.1%} "
                f"over {found['held_out_predictions']} predictions, majority-class rate "
                f"{found['held_out_majority_rate']:.1%}), so a training accuracy that rises later is memorisation")
    plateau = (f" (or the model sits on a plateau longer than {found['to_step'] - found['from_step']} steps before it "
               f"starts to learn")
    if "held_out_predictions" in found:  # evaluations were watched, none ran after the decision
        return plateau + ": no evaluation on held-out data ran after it to tell the two apart)"
    return plateau + ")"


def with_held_out(found: dict, evaluations: Sequence[Evaluation]) -> dict:
    """The decision's evidence with the held-out evaluations after it (0 predictions: none ran)."""
    later = [e for e in evaluations if e.step > found["to_step"] and e.seen > 0]
    if not later:
        return {**found, "held_out_predictions": 0}
    seen = sum(e.seen for e in later)
    counts = [sum(column) for column in zip(*(e.counts for e in later), strict=True)]
    return {**found, "held_out_predictions": seen,
            "held_out_accuracy": round(sum(e.correct for e in later) / seen, 4),
            "held_out_majority_rate": round(max(counts) / sum(counts), 4) if counts and sum(counts) else 0.0}


def confirmed(batches: Sequence[BatchOutcome], counts: Sequence[float], found: dict,
              evaluations: Sequence[Evaluation] = ()) -> bool:
    """An early decision still stands at the end of the run: the model does not learn.

    Predictions on held-out data (an evaluation loop: samples the model is never trained on)
    judge first. If the labels were independent of the inputs, a model's held-out accuracy would
    be at most the majority rate at every evaluation, memorised training labels or not: the last
    evaluation, or all of them together, significantly above the majority rate withdraws the
    decision (α = 0.05 split over the two: a miss costs less than a false alarm); all the
    evaluations after the decision together significantly below majority + δ confirm it, even
    when the training accuracy rises (a model memorising its random training labels).
    Otherwise the training batches after the decision judge: accuracy significantly above
    majority + δ, over all of them or over the last pass, withdraws the decision (a correct model that sat on a plateau and then learned;
    measured: the keras-io transformer text classifier stays at chance for its first epoch,
    then learns); so does a model that memorises its random labels without an evaluation to
    tell, a miss accepted to keep false alarms away."""
    total = sum(counts)
    if not total:
        return True
    majority = max(counts) / total
    bound = majority + ACCURACY_MARGIN
    held_out = [e for e in evaluations if e.seen > 0]
    if held_out:
        ceiling = max([majority] + [e.majority_rate for e in held_out])
        last = held_out[-1]
        correct, seen = sum(e.correct for e in held_out), sum(e.seen for e in held_out)
        if (accuracy_above(last.correct, last.seen, ceiling, HELD_OUT_ALPHA / 2)
                or accuracy_above(correct, seen, ceiling, HELD_OUT_ALPHA / 2)):
            return False
        later = [e for e in held_out if e.step > found["to_step"]]
        if later and accuracy_below(sum(e.correct for e in later), sum(e.seen for e in later), bound, ALPHA):
            return True
    after = [b for b in batches if b.step > found["to_step"] and b.correct >= 0]
    return not any(accuracy_above(sum(b.correct for b in part), sum(b.seen for b in part), bound, ALPHA / 2)
                   for part in (after, latest(after)) if sum(b.seen for b in part) >= MIN_PASS_PREDICTIONS)


def latest(batches: Sequence[BatchOutcome]) -> list[BatchOutcome]:
    """Where the model stands at the end: the batches of the last pass over the training data
    (the last third of them when passes are not known). A slow model that learns shows it
    there, after a long stretch near chance that would dilute it in all the batches."""
    if not batches:
        return []
    if batches[-1].visit >= 0:
        return [b for b in batches if b.visit == batches[-1].visit]
    return list(batches[-max(1, len(batches) // 3):])
