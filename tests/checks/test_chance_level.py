"""L108's sequential test (nndoctor.chance_level) on synthetic batch outcomes."""

from __future__ import annotations

import math
import random

from nndoctor import chance_level as C


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
