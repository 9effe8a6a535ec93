"""L105's rule, the classification loss before any update: pure math on floats, shared by the
PyTorch check and the Keras/TensorFlow observers (imports neither framework).

A first loss is suspicious when it exceeds what i.i.d. logits z ~ N(0, σ²) with σ = 3 would
give. Standard initialisation gives σ ≈ 0.3–1 (loss ≈ ln C); σ = 3 already means a saturated
softmax. The expected loss has no closed form for small C, so it is simulated with a generator of
its own (the user's random streams are never touched).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

INITIAL_LOGIT_STD = 3.0
# Keras: Dense layers start with glorot-uniform weights (variance 2/(fan_in + fan_out)), whose
# logits spread about √6 times more than PyTorch's default Linear init for a narrow head, and
# the first loss is one batch: the threshold allows logits of std 5 (measured false alarm at σ = 3:
# a BatchNormalization + Dense(2, softmax) model whose first batch loss was 1.97 for 2 classes).
KERAS_INITIAL_LOGIT_STD = 5.0


def initial_loss_excess(losses: Sequence[float], classes: int) -> float | None:
    """Mean initial loss minus ln(C) (None without data)."""
    finite = [v for v in losses if math.isfinite(v)]
    if not finite or classes < 2:
        return None
    return sum(finite) / len(finite) - math.log(classes)


@functools.lru_cache(maxsize=64)
def expected_excess(classes: int, sigma: float = INITIAL_LOGIT_STD, values: int = 1 << 18) -> float:
    """E[cross-entropy] − ln C for i.i.d. N(0, σ²) logits over C classes (Monte Carlo over
    about ``values`` logits: standard error < 1% of the result for any C)."""
    import numpy as np

    generator = np.random.default_rng(0)
    rows = max(256, values // classes)
    logits = generator.standard_normal((rows, classes)) * sigma
    top = logits.max(axis=1, keepdims=True)
    logsumexp = (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))[:, 0]
    ce = logsumexp - logits[:, 0]  # the target's logit is just as random
    return float(ce.mean()) - math.log(classes)


def initial_loss_finding(losses: Sequence[float], classes: int,
                         sigma: float = INITIAL_LOGIT_STD) -> tuple[str, dict] | None:
    """L105's statement and evidence when the first losses exceed the threshold, else None."""
    excess = initial_loss_excess(losses, classes)
    if excess is None:
        return None
    limit = expected_excess(classes, sigma)
    if excess <= limit:
        return None
    ln_c = math.log(classes)
    mean = excess + ln_c
    message = (
        f"the first loss{'es' if len(losses) > 1 else ''} before any optimizer step "
        f"{'average' if len(losses) > 1 else 'is'} {mean:.3g} for {classes} classes, while an untrained model should give about "
        f"ln({classes}) = {ln_c:.3g}; the threshold {ln_c + limit:.3g} is the loss of random logits "
        f"with std {sigma:g} (standard initialisation gives ≲ 1): the network starts saturated "
        f"or its inputs are far from unit scale.")
    evidence = {"initial_losses": [round(v, 4) for v in losses], "classes": classes,
                "ln_classes": ln_c, "threshold": ln_c + limit}
    return message, evidence
