"""Unit tests of the L1xx detection functions (no training loop)."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn as nn

from nndoctor.checks import losses as L
from nndoctor.instrument.inputs_probe import summarize_class_axis


def test_probabilities_and_log_probabilities():
    torch.manual_seed(0)
    logits = torch.randn(16, 5) * 3
    probs = summarize_class_axis(logits.softmax(1))
    logp = summarize_class_axis(logits.log_softmax(1))
    raw = summarize_class_axis(logits)
    assert L.looks_like_probabilities(probs) and not L.looks_like_log_probabilities(probs)
    assert L.looks_like_log_probabilities(logp) and not L.looks_like_probabilities(logp)
    assert not L.looks_like_probabilities(raw) and not L.looks_like_log_probabilities(raw)
    # small positive logits in [0, 1] that do not sum to 1 are not probabilities
    assert not L.looks_like_probabilities(summarize_class_axis(torch.rand(16, 5)))
    # segmentation-shaped inputs: class axis is dim 1
    assert L.looks_like_probabilities(summarize_class_axis(torch.randn(2, 4, 3, 3).softmax(1)))
    assert summarize_class_axis(torch.randn(8, 1)) is None  # one "class": nothing to say


def test_grad_fn_name_looks_through_reshapes():
    x = torch.randn(4, 1, requires_grad=True)
    assert L.grad_fn_name(torch.sigmoid(x)) == "SigmoidBackward0"
    assert L.grad_fn_name(torch.sigmoid(x).squeeze(1)) == "SigmoidBackward0"
    assert L.grad_fn_name(nn.Softmax(dim=1)(x).view(-1)) == "SoftmaxBackward0"
    assert L.grad_fn_name(x * 2) == "MulBackward0"
    assert L.grad_fn_name(torch.randn(3)) == ""


def test_broadcast_blowup():
    assert L.broadcast_blowup((16, 1), (16,)) == (16, 16)
    assert L.broadcast_blowup((16, 1), (16, 1)) is None
    assert L.broadcast_blowup((16, 3), (3,)) is None  # per-class weights: no growth
    assert L.broadcast_blowup((16, 3), (5,)) is None  # incompatible: torch raises itself


def test_hand_written_broadcasts_finds_column_vs_vector():
    model = nn.Linear(3, 1)
    x, y = torch.randn(8, 3), torch.randn(8)
    found = L.hand_written_broadcasts(((model(x) - y) ** 2).mean())
    assert found and found[0][1] == (8, 8) and found[0][2] == (8, 1)
    assert not L.hand_written_broadcasts(((model(x).squeeze(1) - y) ** 2).mean())
    assert not L.hand_written_broadcasts(((model(x) - y[:, None]) ** 2).mean())


def test_hand_written_broadcasts_ignores_deliberate_pairwise_terms():
    emb = nn.Linear(3, 1)(torch.randn(8, 3)).squeeze(1)
    pairwise = emb.unsqueeze(1) - emb.unsqueeze(0)  # (8, 8) by design
    assert not L.hand_written_broadcasts(torch.relu(1 - pairwise).mean())
    assert not L.hand_written_broadcasts(torch.randn(3).sum())  # no graph


def test_initial_loss_excess_and_implied_spread():
    assert L.initial_loss_excess([math.log(10)], 10) == pytest.approx(0.0)
    assert L.initial_loss_excess([12.0, 13.0], 10) == pytest.approx(12.5 - math.log(10))
    assert L.initial_loss_excess([], 10) is None
    assert L.initial_loss_excess([1.0], 1) is None



def test_expected_excess_matches_cross_entropy_of_random_logits():
    # the threshold's model, checked against torch's own cross_entropy on fresh samples
    gen = torch.Generator().manual_seed(1)
    for classes in (2, 10, 100):
        logits = torch.randn(20000, classes, generator=gen) * L.INITIAL_LOGIT_STD
        target = torch.randint(0, classes, (20000,), generator=gen)
        ce = nn.functional.cross_entropy(logits, target).item()
        assert ce - math.log(classes) == pytest.approx(L.expected_excess(classes), rel=0.05)
    assert L.expected_excess(10) > L.expected_excess(10, sigma=1.0) > 0


def test_expected_excess_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    L.expected_excess.cache_clear()
    L.expected_excess(7)
    assert torch.equal(torch.rand(3), expected)
    import numpy as np

    np.random.seed(5)
    expected_np = np.random.rand(3)
    np.random.seed(5)
    L.expected_excess.cache_clear()
    L.expected_excess(9)
    assert np.array_equal(np.random.rand(3), expected_np)


def test_mann_kendall_z():
    assert L.mann_kendall_z(list(range(40))) > 5
    assert L.mann_kendall_z(list(range(40, 0, -1))) < -5
    rng = random.Random(0)
    noise = [rng.gauss(0, 1) for _ in range(200)]
    assert abs(L.mann_kendall_z(noise)) < 2.5
    assert L.mann_kendall_z([1.0, 1.0]) == 0.0


def test_loss_trend_verdicts():
    rng = random.Random(1)
    decreasing = [2.3 * math.exp(-i / 30) + 0.05 * rng.random() for i in range(60)]
    flat = [1.38 + 0.05 * rng.gauss(0, 1) for _ in range(60)]
    diverging = [0.5 * 1.05**i for i in range(60)]
    slowly_decreasing = [1.0 - 0.002 * i + 0.01 * rng.gauss(0, 1) for i in range(60)]
    assert L.loss_trend(decreasing) is None
    assert L.loss_trend(slowly_decreasing) is None
    assert L.loss_trend(flat)[0] == "not-decreasing"
    assert L.loss_trend(diverging)[0] == "diverging"
    assert L.loss_trend(flat[: L.TREND_MIN_POINTS - 1]) is None  # too few points
    assert L.loss_trend([-v for v in flat]) is None  # negative objectives are not judged
    assert L.thirds_ratio([1, 1, 1, 2, 2, 2]) == 2.0


def test_a_loss_that_already_fell_tenfold_has_converged_and_a_jump_is_divergence():
    from nndoctor.core.rules import loss_trend as LT

    rng = random.Random(2)
    floor = [0.09 + 0.01 * rng.gauss(0, 1) for _ in range(570)]
    converged = [6.7, 5.6, 0.25, 0.15, 0.1, *floor]  # a 70× fall within a few steps, then the floor
    assert L.mann_kendall_z(converged) > L.NOT_DECREASING_Z  # the trend alone reads "does not go down"
    assert L.loss_trend(converged) is None
    assert L.loss_trend([0.5, 0.3, 0.2, *floor])[0] == "not-decreasing"  # a fall of 3× is not convergence
    drifting_down = [1e-4, 20.0, 900.0, *[20.0 * math.exp(-i / 40) + 1.0 for i in range(120)]]
    assert L.mann_kendall_z(drifting_down) < -5  # the trend test sees a decrease
    kind, _, ratio = L.loss_trend(drifting_down)
    assert kind == "jumped" and ratio > LT.JUMP_RATIO
    sentence = L.trend_sentence(kind, 0.0, ratio, len(drifting_down), values=drifting_down)
    assert "first loss 0.0001" in sentence and "threshold 100×" in sentence
    assert L.loss_trend([0.0, *floor]) is not None and LT.jump_ratio([0.0, 1.0]) == 1.0  # a first loss of 0
