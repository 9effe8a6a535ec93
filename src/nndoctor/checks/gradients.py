"""Gradient magnitudes and update sizes: O104 exploding, O105 vanishing, O106 update scale,
O109 Adam with coupled L2 weight decay.

All gradient numbers come from ``cached_gradient_stats`` (one fused norm computation per
sampled step, shared with N102); the decisions are the pure functions below.
"""

from __future__ import annotations

import math
import statistics
import weakref
from collections import deque
from typing import Any

import torch

from nndoctor.checks._params import optimizer_params, spread_sample, value_slice
from nndoctor.core.events import RunEnd, StepEnd, StepStart
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.rules.gradient_explosion import (
    EXPLOSION_GROWTH,
    EXPLOSION_HUGE,
    explosion_verdict,
)
from nndoctor.core.subscribers import sampled_only
from nndoctor.instrument.numerics_probe import (
    GradientStats,
    cached_gradient_stats,
    construction_site,
)


# -- O104 ----------------------------------------------------------------------------------------
@register
class ExplodingGradients(Check):
    """
    ## What it does
    At sampled ``optimizer.step()`` calls, reads the total gradient norm (L2 over all the
    optimizer's gradients, shared statistics) and reports when it is **≥ 1000×** the median
    norm of the first three sampled steps, or **≥ 1e5** outright. Non-finite norms are
    N102's; gradients clipped before the step (``clip_grad_norm_``) are seen clipped and do
    not fire.

    ## Why is this bad?
    Exploding gradients turn each step into a jump: the loss spikes, then becomes Inf/NaN,
    whatever the learning rate. Growth
    by three orders of magnitude is far beyond the usual drift of gradient norms during
    training (typically within 10–100× of their initial value); a norm of 1e5 is 10^5 times
    the ``max_norm=1.0`` that gradient clipping commonly enforces (Pascanu et al. 2013).

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # far too high for this model
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)   # before step()
    ```
    Also check the scale of the targets (regression on unnormalised values) and the loss
    reduction (``sum`` over a large batch).

    ## References
    - Pascanu, Mikolov, Bengio, "On the difficulty of training recurrent neural networks" (2013): https://arxiv.org/abs/1211.5063
    - PyTorch docs, ``clip_grad_norm_``: https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html
    """

    code = "O104"
    name = "exploding-gradients"
    severity = Severity.WARNING
    summary = "gradient norm grows by orders of magnitude or is huge"
    fix = "lower the learning rate, clip gradients (clip_grad_norm_), normalise inputs and targets"
    GROWTH = EXPLOSION_GROWTH
    HUGE = EXPLOSION_HUGE

    def __init__(self, session) -> None:
        super().__init__(session)
        self._norms: dict[int, list[float]] = {}
        self._reported: set[int] = set()

    @sampled_only
    def on_step_start(self, event: StepStart) -> None:
        if not event.sampled or event.has_closure:
            return
        key = id(event.optimizer)
        if key in self._reported:
            return
        stats = cached_gradient_stats(event, self.session)
        if stats is None or stats.nonfinite:
            return
        norms = self._norms.setdefault(key, [])
        norms.append(stats.total_norm)
        verdict = explosion_verdict(norms, self.GROWTH, self.HUGE)
        if verdict is None:
            return
        self._reported.add(key)
        kind, current, baseline = verdict
        top = max(range(len(stats.norms)), key=lambda i: stats.norms[i])
        why = (f"{current / baseline:.3g}× the {baseline:.3g} of the first sampled steps (threshold "
               f"{self.GROWTH:g}×)" if kind == "growth" else f"above {self.HUGE:g}")
        self.report(
            f"Total gradient norm {current:.3g} at step {event.step} is {why}; largest: "
            f"{stats.names[top]} ({stats.norms[top]:.3g}). Gradients are exploding.",
            location=event.location,
            evidence={"total_norm": current, "baseline_norm": baseline, "criterion": kind,
                      "largest_parameter": stats.names[top], "history": norms[-8:]},
            step=event.step,
        )


# -- O105 ----------------------------------------------------------------------------------------
def depth_ratio(stats: GradientStats, min_layers: int = 4) -> tuple[float, str, str] | None:
    """(early/late gradient RMS ratio, earliest name, latest name) over weight matrices.

    Only tensors with at least 2 dimensions (Linear/Conv/Embedding weights) count, in the
    optimizer's (= definition) order; early and late are the medians of the first and last
    quarter. RMS (norm / sqrt(numel)) makes layers of different sizes comparable.
    """
    idx = [i for i, d in enumerate(stats.dims) if d >= 2 and math.isfinite(stats.norms[i])]
    if len(idx) < min_layers:
        return None
    q = max(1, len(idx) // 4)
    early = statistics.median(stats.rms(i) for i in idx[:q])
    late = statistics.median(stats.rms(i) for i in idx[-q:])
    if late <= 0:
        return None
    return early / late, stats.names[idx[0]], stats.names[idx[-1]]


@register
class VanishingGradients(Check):
    """
    ## What it does
    At sampled steps, compares the gradient RMS (norm / √numel) of the earliest weight
    matrices with that of the latest ones (median of the first and last quarter of the
    optimizer's ≥ 2-D parameters, which follow the order the layers were defined). It
    reports when the early layers' gradients are **below 1/1000** of the late layers' on
    **3 consecutive** sampled steps.

    Known limits and false positives: parameter order is definition order, which is usually
    but not always the forward order (a head defined before the backbone reverses the
    comparison); embeddings touched by few tokens per batch have diluted RMS; with Adam the
    per-parameter normalisation partly compensates small gradients, so the finding is a
    strong hint rather than a certainty there.

    ## Why is this bad?
    With a shared learning rate, layers whose gradients are 1000× smaller learn 1000×
    slower: the first layers stay near their initialisation while the head fits on top of
    random features. The classic cause is a deep stack of saturating activations
    (sigmoid/tanh) without normalisation or residual connections: each sigmoid multiplies
    the backward signal by at most 0.25 (Hochreiter 1991; Glorot & Bengio 2010).
    Measured on 12 layers of width 32 (one batch, cross-entropy): sigmoid 4e-9, tanh 1e-2,
    ReLU with PyTorch's default ``nn.Linear`` init 2.7e-4 (reported: that init is too small
    for deep plain ReLU stacks), ReLU with Kaiming init 0.63. The 1e-3 threshold separates
    them; three consecutive steps keep a one-batch fluke from firing.

    ## Example
    ```python
    layers = []
    for _ in range(12):
        layers += [nn.Linear(32, 32), nn.Sigmoid()]
    model = nn.Sequential(*layers, nn.Linear(32, 2))
    ```

    ## Use instead
    ```python
    for _ in range(12):
        layers += [nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU()]   # or residual blocks
    ```

    ## References
    - Glorot & Bengio, "Understanding the difficulty of training deep feedforward neural networks" (2010): https://proceedings.mlr.press/v9/glorot10a.html
    - He et al., "Deep Residual Learning for Image Recognition" (2015): https://arxiv.org/abs/1512.03385
    """

    code = "O105"
    name = "vanishing-gradients"
    severity = Severity.WARNING
    summary = "early layers' gradient norms orders of magnitude below later layers'"
    fix = "use ReLU-family activations, normalisation layers or residual connections; initialise with Kaiming/Xavier"
    heuristic = True
    RATIO = 1e-3
    CONSECUTIVE = 3

    def __init__(self, session) -> None:
        super().__init__(session)
        self._streak: dict[int, list[float]] = {}
        self._reported: set[int] = set()

    @sampled_only
    def on_step_start(self, event: StepStart) -> None:
        if not event.sampled or event.has_closure:
            return
        key = id(event.optimizer)
        if key in self._reported:
            return
        stats = cached_gradient_stats(event, self.session)
        found = depth_ratio(stats) if stats is not None else None
        streak = self._streak.setdefault(key, [])
        if found is None or found[0] >= self.RATIO:
            streak.clear()
            return
        ratio, early, late = found
        streak.append(ratio)
        if len(streak) < self.CONSECUTIVE:
            return
        self._reported.add(key)
        self.report(
            f"The earliest layers' gradients are {ratio:.2g}× those of the latest layers (RMS of "
            f"{early}… vs …{late}) on {len(streak)} consecutive sampled steps — threshold "
            f"{self.RATIO:g}. The first layers barely learn: gradients vanish on the way back.",
            location=event.location,
            evidence={"ratio": ratio, "ratios": list(streak), "earliest": early, "latest": late,
                      "threshold": self.RATIO},
            step=event.step,
        )


# -- O106 ----------------------------------------------------------------------------------------
def update_ratios(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float | None]:
    """‖Δw‖ / ‖w‖ for each (before, after) slice; None for an all-zero or non-finite slice.

    The norms of every slice are stacked per device and copied to the host together: one
    synchronisation per step instead of two per weight.
    """
    ratios: list[float | None] = [None] * len(pairs)
    by_device: dict[torch.device, list[int]] = {}
    for i, (before, _) in enumerate(pairs):
        by_device.setdefault(before.device, []).append(i)
    with torch.no_grad():
        for indices in by_device.values():
            norms = torch.stack([
                torch.stack([torch.linalg.vector_norm(pairs[i][0].float()),
                             torch.linalg.vector_norm(pairs[i][1].float() - pairs[i][0].float())])
                for i in indices
            ]).cpu().tolist()
            for i, (scale, delta) in zip(indices, norms):
                if scale != 0 and math.isfinite(scale):
                    ratios[i] = delta / scale
    return ratios


def update_scale_verdict(ratios: list[float], low: float, high: float,
                         min_steps: int) -> tuple[str, float] | None:
    """("high"|"low", median ratio) when the median per-step ratio is outside [low, high]."""
    positive = [r for r in ratios if r > 0]
    if len(positive) < min_steps:
        return None
    median = statistics.median(positive)
    if median > high:
        return ("high", median)
    if median < low:
        return ("low", median)
    return None


@register
class UpdateScale(Check):
    """
    ## What it does
    On sampled steps, copies a slice (first 4096 values) of up to 8 weight matrices spread
    over the model before ``optimizer.step()`` and compares after it: the update/weight
    ratio ‖Δw‖/‖w‖. At the end it takes, over the last (up to 16) sampled steps, the median
    of the per-step median ratio, and reports it when it is **above 1e-1** or **below 1e-5**
    — a factor 100 either side of the ~1e-3 rule of thumb. Steps that change nothing are
    M106's, not this check's.

    Known false positives: learning-rate warm-up (early ratios are small on purpose; the
    last steps count most), weights that are legitimately near zero, very short runs.

    ## Why is this bad?
    The ratio says how fast the weights move. Around 1e-3 per step training progresses
    steadily; at 1e-1 each step rewrites a tenth of the weights and training is unstable;
    at 1e-5 it would need 100× more steps to get anywhere. It is the quickest learning-rate
    sanity check that does not depend on the loss.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)   # ratio ≈ 1e-3
    ```

    ## References
    - CS231n, "Neural Networks Part 3", ratio of weights:updates ("somewhere around 1e-3"): https://cs231n.github.io/neural-networks-3/#ratio
    """

    code = "O106"
    name = "update-scale"
    severity = Severity.INFO
    summary = "per-layer update/weight ratio far from ~1e-3 (lr too high or too low)"
    fix = "adjust the learning rate so that the update/weight ratio is near 1e-3"
    heuristic = True
    LOW = 1e-5
    HIGH = 1e-1
    MIN_STEPS = 3
    SLICE = 4096

    def __init__(self, session) -> None:
        super().__init__(session)
        self._before: dict[int, list[tuple[weakref.ref, torch.Tensor]]] = {}
        self._ratios: dict[int, deque[float]] = {}
        self._where: dict[int, tuple[Location | None, str]] = {}

    @sampled_only
    def on_step_start(self, event: StepStart) -> None:
        if not event.sampled or event.has_closure:
            return
        weights = [p for p in optimizer_params(event.optimizer) if p.dim() >= 2 and p.grad is not None]
        self._before[id(event.optimizer)] = [
            (weakref.ref(p), value_slice(p, self.SLICE)) for p in spread_sample(weights)
        ]
        if id(event.optimizer) not in self._where:
            self._where[id(event.optimizer)] = (event.location, type(event.optimizer).__name__)

    @sampled_only  # ``_before`` is taken at a sampled step_start: its step_end is sampled too
    def on_step_end(self, event: StepEnd) -> None:
        if not event.sampled:
            return
        before = self._before.pop(id(event.optimizer), None)
        if not before:
            return
        pairs = [(old, value_slice(p, self.SLICE)) for old, p in
                 ((old, ref()) for ref, old in before) if p is not None]
        ratios = [r for r in update_ratios(pairs) if r is not None] if pairs else []
        if ratios:
            self._ratios.setdefault(id(event.optimizer), deque(maxlen=16)).append(statistics.median(ratios))

    def on_run_end(self, event: RunEnd) -> None:
        for key, ratios in self._ratios.items():
            verdict = update_scale_verdict(list(ratios), self.LOW, self.HIGH, self.MIN_STEPS)
            if verdict is None:
                continue
            kind, median = verdict
            location, opt = self._where.get(key, (None, "optimizer"))
            meaning = ("the learning rate looks too high: each step rewrites a large part of the weights"
                       if kind == "high" else "the learning rate looks too low: the weights barely move")
            self.report(
                f"{opt}: median update/weight ratio {median:.2g} over the last {len(ratios)} sampled steps, "
                f"outside [{self.LOW:g}, {self.HIGH:g}] (rule of thumb ~1e-3): {meaning}.",
                location=location,
                evidence={"median_ratio": median, "ratios": list(ratios), "low": self.LOW, "high": self.HIGH},
                step=event.step,
            )


# -- O109 ----------------------------------------------------------------------------------------
COUPLED_DECAY_OPTIMIZERS = ("Adam", "NAdam", "RAdam", "Adamax")


def coupled_weight_decay(optimizer: Any) -> float | None:
    """The L2 weight decay an Adam-family optimizer adds to the gradient (None: not the case)."""
    if type(optimizer).__name__ not in COUPLED_DECAY_OPTIMIZERS:
        return None
    for group in optimizer.param_groups:
        decay = group.get("weight_decay", 0) or 0
        if decay > 0 and not group.get("decoupled_weight_decay", False):
            return float(decay)
    return None


@register
class AdamWithL2(Check):
    """
    ## What it does
    At the first ``step()`` of each optimizer, flags ``Adam`` (and ``NAdam``, ``RAdam``,
    ``Adamax``) with ``weight_decay > 0`` and without ``decoupled_weight_decay=True``.

    ## Why is this bad?
    In these optimizers ``weight_decay`` adds ``λ·w`` to the gradient *before* the adaptive
    scaling, so parameters with large gradient history are barely regularised: it is not
    the weight decay most recipes assume. Loshchilov & Hutter showed that decoupling the
    decay from the gradient (AdamW) regularises as intended and generalises better; recipes
    that say "Adam, weight decay 0.05" mean AdamW. It is information, not an error: coupled
    L2 with Adam is a legitimate (if weaker) choice.

    ## Example
    ```python
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-2)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    ```

    ## References
    - Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (2019): https://arxiv.org/abs/1711.05101
    - PyTorch docs, ``torch.optim.AdamW``: https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html
    """

    code = "O109"
    name = "adam-with-l2"
    severity = Severity.INFO
    summary = "Adam with weight_decay (coupled L2) where AdamW is meant"
    fix = "use torch.optim.AdamW (decoupled weight decay), or Adam(..., decoupled_weight_decay=True)"
    needs = frozenset({"construction_sites"})

    def __init__(self, session) -> None:
        super().__init__(session)
        self._seen: weakref.WeakSet = weakref.WeakSet()

    # The first steps of every optimizer are sampled (``Session.step_sampled``): its first
    # step, the one this looks at, is never an unsampled one.
    @sampled_only
    def on_step_start(self, event: StepStart) -> None:
        if not event.sampled:
            return
        optimizer = event.optimizer
        if optimizer in self._seen:
            return
        self._seen.add(optimizer)
        decay = coupled_weight_decay(optimizer)
        if decay is None:
            return
        name = type(optimizer).__name__
        self.report(
            f"{name}(weight_decay={decay:g}) adds L2 to the gradient before the adaptive scaling "
            f"(coupled): large-gradient weights are barely decayed. AdamW decouples it.",
            location=construction_site(self.session, optimizer) or event.location,
            evidence={"optimizer": name, "weight_decay": decay},
            step=event.step,
        )
