"""L108's sequential test (nndoctor.core.rules.chance_level) on synthetic batch outcomes."""

from __future__ import annotations

import math
import random

from nndoctor.core.rules import chance_level as C


def _batches(steps, accuracy, loss, rng, size=32, slope=0.0):
    return [C.BatchOutcome(step, loss(step) + 0.02 * rng.gauss(0, 1),
                           sum(rng.random() < accuracy(step) for _ in range(size)), size)
            for step in range(steps)]


def test_labels_independent_of_inputs_are_decided_early():
    rng = random.Random(0)
    counts = [250, 250, 250, 250]
    at_chance = _batches(80, lambda s: 0.25, lambda s: math.log(4), rng)
    found = C.at_chance(at_chance, counts)
    assert found is not None and found["from_step"] == C.BURN_IN_STEPS
    assert found["to_step"] - found["from_step"] >= C.MIN_SPAN_STEPS and found["to_step"] < 80
    # Memorising the random labels later (accuracy up, loss down) does not undo the early decision.
    memorised = at_chance + _batches(200, lambda s: 0.9, lambda s: 0.3, rng)[80:]
    assert C.at_chance(memorised, counts)["to_step"] == found["to_step"]
    assert C.confirmed(at_chance, counts, found)
    # ...but accuracy well above the majority rate afterwards withdraws it at the end of the run
    # (a correct model off a plateau; memorised random labels look the same: a miss accepted).
    assert not C.confirmed(memorised, counts, found)
    assert "H(y) = 1.39" in C.chance_sentence(found)


def test_learning_models_and_short_runs_are_not_at_chance():
    rng = random.Random(1)
    counts = [250, 250, 250, 250]
    learns = _batches(200, lambda s: min(0.9, 0.25 + s / 100), lambda s: math.log(4) * math.exp(-s / 60), rng)
    assert C.at_chance(learns, counts) is None and C.learning(learns, counts)
    short = _batches(C.BURN_IN_STEPS + C.MIN_SPAN_STEPS - 1, lambda s: 0.25, lambda s: math.log(4), rng)
    assert C.at_chance(short, counts) is None
    # At chance but the loss keeps falling through H(y): a slow learner, not decoupled labels.
    slow = _batches(90, lambda s: 0.27, lambda s: math.log(4) * (1.02 - s / 1500), rng)
    assert C.at_chance(slow, counts) is None
    # A loss far above ln C is a broken model, not chance.
    broken = _batches(90, lambda s: 0.25, lambda s: 3 * math.log(4), rng)
    assert C.at_chance(broken, counts) is None


def test_loss_alone_needs_a_longer_window():
    rng = random.Random(2)
    counts = [600, 400]
    prior = C.entropy(counts)
    losses = [C.BatchOutcome(step, prior + 0.02 * rng.gauss(0, 1)) for step in range(120)]
    found = C.at_chance(losses, counts)
    assert found is not None and found["accuracy"] is None
    assert found["to_step"] - found["from_step"] >= C.LOSS_ONLY_MIN_SPAN_STEPS
    assert C.at_chance(losses[:90], counts) is None


def test_chernoff_bound_and_entropy():
    assert C.accuracy_below(250, 1000, 0.35, 0.01)
    assert not C.accuracy_below(330, 1000, 0.35, 0.01)
    assert C.entropy([1, 1]) == math.log(2) and C.bernoulli_kl(0.3, 0.3) == 0.0


def _passes(accuracies, steps_per_pass, rng, size=8, prior=None, loss_of=None):
    """Batches of successive passes over a DataLoader: one accuracy per pass."""
    counts = [1, 1]
    prior = C.entropy(counts) if prior is None else prior
    batches = []
    for visit, accuracy in enumerate(accuracies):
        for index in range(steps_per_pass):
            step = visit * steps_per_pass + index
            loss = loss_of(accuracy) if loss_of else prior * (1 + 0.3 * (0.5 - accuracy)) + 0.01 * rng.gauss(0, 1)
            batches.append(C.BatchOutcome(step, loss, sum(rng.random() < accuracy for _ in range(size)), size, visit))
    return batches


def test_with_passes_known_the_first_two_decide_and_memorising_later_does_not_count():
    rng = random.Random(3)
    counts = [1, 1]
    # 16 steps a pass (128 samples, batch 8): at chance for two passes, then memorised.
    memorised = _passes([0.5, 0.5, 0.7, 0.85, 0.95], 16, rng)
    found = C.at_chance(memorised, counts)
    assert found is not None and found["passes"] == 2
    assert found["from_step"] == 16 // C.BURN_IN_SHARE and found["to_step"] == 31  # one look, when pass 2 ends
    assert found["looks"] == 1 and found["predictions"] == (32 - 4) * 8
    assert "its first 2 passes over the training data" in C.chance_sentence(found)
    assert C.undecidable(memorised) and not C.undecidable(memorised[:32])
    # Still in the second pass: not decided yet (no look before the window is complete or 50 steps long).
    assert C.at_chance(memorised[:30], counts) is None
    # The same batches without pass information: memorised batches enter the window, nothing fires.
    unknown = [C.BatchOutcome(b.step, b.loss, b.correct, b.seen) for b in memorised]
    assert C.at_chance(unknown, counts) is None


def test_a_correct_model_that_learns_in_its_second_pass_is_not_at_chance():
    rng = random.Random(4)
    # Measured on a tiny BERT under Trainer with the labels in place: 55%, 72%, 98%, 100% per pass.
    learns = _passes([0.55, 0.72, 0.98, 1.0], 16, rng)
    assert C.at_chance(learns, [285, 355]) is None


def test_held_out_predictions_tell_memorising_from_learning():
    rng = random.Random(5)
    counts = [1, 1]
    batches = _passes([0.5, 0.5, 0.9, 0.95, 1.0], 16, rng)
    found = C.at_chance(batches, counts)
    assert found is not None
    # Without an evaluation, rising training accuracy withdraws the report (a miss accepted) ...
    assert not C.confirmed(batches, counts, found)

    def evaluation(step, accuracy, size=128, counts=(64, 64)):
        return C.Evaluation(step, sum(rng.random() < accuracy for _ in range(size)), size, counts)

    # ... an evaluation at chance after each pass keeps it (the model memorises its random labels) ...
    at_chance = [evaluation(step, 0.5) for step in (47, 63, 79)]
    assert C.confirmed(batches, counts, found, at_chance)
    # ... and one that learns withdraws it (a correct model off a plateau), even while still below
    # majority + δ: above the majority rate on held-out data, the labels depend on the inputs.
    assert not C.confirmed(batches, counts, found, at_chance[:-1] + [evaluation(79, 0.72)])
    # A held-out set whose own majority is higher must beat that majority (here the training
    # batches stay at chance after the decision too).
    flat = batches[:32] + _passes([0.5] * 5, 16, rng)[32:]
    assert not C.confirmed(flat, counts, found, at_chance[:-1] + [evaluation(79, 0.72)])
    assert C.confirmed(flat, counts, found, at_chance[:-1] + [evaluation(79, 0.72, counts=(96, 32))])
    # Too few held-out predictions to conclude: the training batches judge again.
    assert not C.confirmed(batches, counts, found, [evaluation(79, 0.55, size=16)])
    # Evaluations before the decision confirm nothing, but above the majority rate they withdraw.
    assert not C.confirmed(batches, counts, found, [evaluation(step, 0.5) for step in (15, 31)])
    assert not C.confirmed(flat, counts, found, [evaluation(step, 0.72) for step in (15, 31)])

def test_binomial_tail_is_exact():
    def brute(k, n, p, upper=False):
        ks = range(k, n + 1) if upper else range(0, k + 1)
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in ks)

    for k, n, p in ((3, 10, 0.5), (40, 100, 0.55), (0, 7, 0.3), (120, 224, 0.655), (7, 7, 0.9)):
        assert math.isclose(C.binomial_tail(k, n, p), brute(k, n, p), rel_tol=1e-9, abs_tol=1e-300)
        assert math.isclose(C.binomial_tail(k, n, p, upper=True), brute(k, n, p, upper=True), rel_tol=1e-9)
    assert C.binomial_tail(99_999, 100_000, 0.5) == 1.0 and C.binomial_tail(0, 100_000, 0.5, upper=True) == 1.0
    assert C.binomial_tail(-1, 10, 0.5) == 0.0 and C.binomial_tail(11, 10, 0.5, upper=True) == 0.0
    assert C.accuracy_below(120, 224, 0.655, 0.005) and not C.accuracy_below(140, 224, 0.655, 0.005)
    assert C.accuracy_above(200, 224, 0.655, 0.01) and not C.accuracy_above(150, 224, 0.655, 0.01)
