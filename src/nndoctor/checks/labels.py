"""What the classifier sees and predicts: D111 label imbalance, L109 prediction collapse.

Both read class histograms of the loss's input and target on sampled steps only (one
``bincount`` and one host copy per sampled loss).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import torch

from nndoctor.core.events import LossComputed, RunEnd
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.rules.loss_trend import (
    NOT_DECREASING_RATIO,
    NOT_DECREASING_Z,
    mann_kendall_z,
    thirds_ratio,
)
from nndoctor.core.subscribers import sampled_only

_CLASS_INDEX_LOSSES = ("cross_entropy", "nll_loss")
_BINARY_LOSSES = ("binary_cross_entropy", "binary_cross_entropy_with_logits")


_HISTOGRAMS_KEY = "nndoctor.class_histograms"


def class_histograms(event: LossComputed) -> tuple[list[int], list[int]] | None:
    """Computed once per loss event and shared by D111 and L109 (see ``_class_histograms``)."""
    if _HISTOGRAMS_KEY not in event.cache:
        event.cache[_HISTOGRAMS_KEY] = _class_histograms(event)
    return event.cache[_HISTOGRAMS_KEY]


def _class_histograms(event: LossComputed) -> tuple[list[int], list[int]] | None:
    """(target counts, argmax-prediction counts) per class for a single-label classification
    loss with targets of shape (N,) and inputs (N, C); None for anything else (segmentation,
    soft targets, multi-label)."""
    x, y = event.input, event.target
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return None
    if event.function in _CLASS_INDEX_LOSSES:
        if x.dim() != 2 or y.dim() != 1 or y.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            return None
        classes = int(x.shape[1])
        if classes < 2 or y.shape[0] != x.shape[0]:
            return None
        with torch.no_grad():
            labels = y.detach()
            ignore = event.options.get("ignore_index", -100)
            valid = labels[(labels >= 0) & (labels < classes) & (labels != ignore)].long()
            both = torch.cat([torch.bincount(valid, minlength=classes)[:classes],
                              torch.bincount(x.detach().argmax(dim=1), minlength=classes)[:classes]])
            counts = both.tolist()  # one host copy for both histograms
        return counts[:classes], counts[classes:]
    if event.function in _BINARY_LOSSES:
        if x.shape != y.shape or x.dim() > 2 or (x.dim() == 2 and x.shape[1] != 1) or x.dim() == 0:
            return None
        with torch.no_grad():
            labels = y.detach().reshape(-1)
            if not torch.is_floating_point(labels):
                labels = labels.float()
            threshold = 0.0 if event.function.endswith("logits") else 0.5
            positive_pred = (x.detach().reshape(-1) > threshold)
            stats = torch.stack([(labels < 0.5).sum(), (labels >= 0.5).sum(),
                                 (~positive_pred).sum(), positive_pred.sum()]).tolist()
        return [int(stats[0]), int(stats[1])], [int(stats[2]), int(stats[3])]
    return None


def imbalance_ratio(counts: list[int]) -> tuple[float, int, int] | None:
    """(largest/smallest count over the classes seen, index of largest, index of smallest)."""
    seen = [(c, i) for i, c in enumerate(counts) if c > 0]
    if len(seen) < 2:
        return None
    largest, smallest = max(seen), min(seen)
    return largest[0] / smallest[0], largest[1], smallest[1]


def balancing_weights(counts: list[int]) -> list[float]:
    """Class weights ``N / (C · count)`` (scikit-learn's "balanced"); 0 for classes never seen."""
    total, classes = sum(counts), len(counts)
    return [round(total / (classes * c), 3) if c else 0.0 for c in counts]


def _histogram_text(counts: list[int], limit: int = 10) -> str:
    total = sum(counts) or 1
    shown = sorted(range(len(counts)), key=lambda i: -counts[i])[:limit]
    parts = [f"class {i}: {counts[i]} ({counts[i] / total:.1%})" for i in shown]
    more = len(counts) - len(shown)
    return ", ".join(parts) + (f", … {more} more" if more > 0 else "")


def vocabulary_embedding(roots: list, classes: int, *, max_modules: int = 100_000) -> str | None:
    """The name of an ``nn.Embedding`` of ``classes`` rows in one of the models, when there is one:
    the loss's classes are then the model's token vocabulary (a language model, a masked LM, a
    decoder), whose frequencies follow Zipf's law by nature — not a class-imbalance problem."""
    for root in roots:
        for count, (name, module) in enumerate(root.named_modules()):
            if count >= max_modules:
                break
            if (isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag))
                    and int(module.num_embeddings) == classes):
                return f"{type(root).__name__}.{name}" if name else type(root).__name__
    return None


def targets_are_tokens(session, classes: int) -> bool:
    """Are the loss's ``classes`` the vocabulary of an embedding in the models being trained?"""
    state = session.state
    return vocabulary_embedding(state.trained_roots() or list(state.roots), classes) is not None


@register
class LabelImbalance(Check):
    """
    ## What it does
    On sampled steps, counts the class labels of every single-label classification loss
    computed with gradients (``cross_entropy``/``nll_loss`` with targets of shape (N,), or a
    binary BCE with one output per sample) — the labels *as the model sees them*, after any
    sampler. Once at least 256 labels from 8 batches were counted, it reports when the
    largest class has **≥ 10×** as many labels as the smallest class seen, and the loss has
    no class weights (``weight`` / ``pos_weight``). The finding gives the measured
    distribution and the balancing weights ``N / (C · count)`` to pass to the loss.

    ## Why is this bad?
    With a 10:1 skew, predicting the majority class already gives a low loss and a high
    accuracy; the gradient from the rare classes is drowned, and the model learns them
    late or never — the accuracy looks fine while the rare classes, often the ones that
    matter, are missed. Amazon SageMaker Debugger's ``ClassImbalance`` rule raises at the
    same ratio (``threshold_imbalance``, default 10).

    ## Example
    ```python
    # 95% of the training samples are class 0
    loss = F.cross_entropy(model(x), y)
    ```

    ## Use instead
    ```python
    weights = torch.tensor([0.53, 10.0])                   # N / (C · count), from the finding
    loss = F.cross_entropy(model(x), y, weight=weights)
    ```
    or resample: ``WeightedRandomSampler`` with per-sample weights ``1 / count[label]``
    (the labels seen then become balanced, and this check silent). Segmentation targets
    (N, H, W), where a dominant background is expected, are not counted, nor are tokens: when
    the number of classes equals the rows of an ``nn.Embedding`` of the model, the targets are
    tokens of its vocabulary (next-token prediction of a language model, masked tokens,
    a decoder's outputs), whose frequencies follow Zipf's law by nature — weighting them
    would change what the model learns, not fix a skew. Threshold: the
    SageMaker default of 10.

    ## References
    - Amazon SageMaker Debugger, ``ClassImbalance`` rule (``threshold_imbalance`` = 10): https://docs.aws.amazon.com/sagemaker/latest/dg/class-imbalance.html
    - PyTorch docs, ``CrossEntropyLoss`` (``weight``): https://pytorch.org/docs/stable/generated/torch.nn.CrossEntropyLoss.html
    - PyTorch docs, ``WeightedRandomSampler``: https://pytorch.org/docs/stable/data.html#torch.utils.data.WeightedRandomSampler
    """

    code = "D111"
    name = "label-imbalance"
    severity = Severity.WARNING
    summary = "class labels seen at runtime heavily skewed (largest/smallest ratio ≥ 10, no class weights)"
    fix = "pass class weights to the loss (weight=… / pos_weight=…) or resample with WeightedRandomSampler"
    THRESHOLD = 10.0
    MIN_LABELS = 256
    MIN_BATCHES = 8

    def __init__(self, session) -> None:
        super().__init__(session)
        self._counts: dict[Location | None, list[int]] = {}
        self._batches: dict[Location | None, int] = {}
        self._done: set[Location | None] = set()

    @sampled_only
    def on_loss(self, event: LossComputed) -> None:
        if not event.sampled or not isinstance(event.output, torch.Tensor) or not event.output.requires_grad:
            return
        if event.options.get("weight") is not None or event.options.get("pos_weight") is not None:
            return
        where = event.location
        if where in self._done:
            return
        histograms = class_histograms(event)
        if histograms is None:
            return
        targets = histograms[0]
        counts = self._counts.setdefault(where, [0] * len(targets))
        if len(counts) != len(targets):
            return
        for i, c in enumerate(targets):
            counts[i] += c
        self._batches[where] = self._batches.get(where, 0) + 1
        if sum(counts) < self.MIN_LABELS or self._batches[where] < self.MIN_BATCHES:
            return
        self._done.add(where)
        found = imbalance_ratio(counts)
        if found is None or found[0] < self.THRESHOLD:
            return
        if targets_are_tokens(self.session, len(counts)):
            return  # next-token / masked-token targets over the vocabulary the model embeds
        ratio, largest, smallest = found
        weights = balancing_weights(counts)
        kind = "binary targets" if event.function in _BINARY_LOSSES else f"{len(counts)} classes"
        self.report(
            f"The training labels are heavily skewed ({kind}, {sum(counts)} labels over "
            f"{self._batches[where]} sampled batches): class {largest} has {ratio:.1f}× as many as class "
            f"{smallest} (threshold {self.THRESHOLD:g}). Distribution: {_histogram_text(counts)}. The loss has "
            f"no class weights; balanced weights would be {weights[:10]}{' …' if len(weights) > 10 else ''}.",
            location=where,
            evidence={"ratio": round(ratio, 3), "largest_class": largest, "smallest_class": smallest,
                      "counts": counts[:50], "labels_counted": sum(counts), "suggested_weights": weights[:50],
                      "threshold": self.THRESHOLD},
            step=event.step,
        )


def collapse_verdict(window: list[tuple[list[int], list[int]]], *, share: float = 0.95,
                     excess: float = 0.3, min_predictions: int = 128) -> tuple[int, float, float] | None:
    """(class, its share of the predictions, its share of the targets) when one class takes
    ≥ ``share`` of the predictions in *every* batch of the window and overall exceeds its
    share of the targets by ≥ ``excess``; None otherwise."""
    if not window:
        return None
    classes = len(window[0][1])
    predicted = [0] * classes
    targets = [0] * classes
    for target_counts, prediction_counts in window:
        if len(prediction_counts) != classes:
            return None
        batch_total = sum(prediction_counts)
        if not batch_total or max(prediction_counts) / batch_total < share:
            return None
        for i in range(classes):
            predicted[i] += prediction_counts[i]
            targets[i] += target_counts[i]
    total = sum(predicted)
    if total < min_predictions:
        return None
    top = max(range(classes), key=lambda i: predicted[i])
    predicted_share = predicted[top] / total
    target_share = targets[top] / (sum(targets) or 1)
    if predicted_share < share or predicted_share - target_share < excess:
        return None
    return top, predicted_share, target_share


def loss_stopped_improving(losses: list[float], *, min_points: int = 6) -> tuple[float, float] | None:
    """(Mann–Kendall z, last-third/first-third median ratio) when ``losses`` (the sampled
    losses of a collapse, in order) show no decrease — no significant downward trend and the
    last third not 1% below the first; None while the loss still goes down or with too few
    finite values to tell. A loss that is NaN or infinite on the last ``min_points`` batches
    does not improve either: (nan, nan)."""
    if len(losses) >= min_points and not any(math.isfinite(v) for v in losses[-min_points:]):
        return math.nan, math.nan  # NaN/inf: nothing left to improve
    finite = [v for v in losses if math.isfinite(v)]
    if len(finite) < min_points:
        return None
    z, ratio = mann_kendall_z(finite), thirds_ratio(finite)
    if z > NOT_DECREASING_Z and ratio > NOT_DECREASING_RATIO:
        return z, ratio
    return None


_MAX_TREND_POINTS = 256


@dataclass
class _Collapse:
    """One class predicted in every sampled batch since ``start`` (one location)."""

    start: int
    last: int
    batches: int
    predicted: list[int]
    targets: list[int]
    losses: list[float] = field(default_factory=list)

    def add(self, step: int, histograms: tuple[list[int], list[int]], loss: float) -> None:
        target_counts, prediction_counts = histograms
        self.last = step
        self.batches += 1
        self.predicted = [a + b for a, b in zip(self.predicted, prediction_counts)]
        self.targets = [a + b for a, b in zip(self.targets, target_counts)]
        self.losses.append(loss)
        del self.losses[:-_MAX_TREND_POINTS]  # the trend test is quadratic in its points

    def shares(self) -> tuple[int, float, float]:
        top = max(range(len(self.predicted)), key=lambda i: self.predicted[i])
        return (top, self.predicted[top] / (sum(self.predicted) or 1),
                self.targets[top] / (sum(self.targets) or 1))


@register
class PredictionCollapse(Check):
    """
    ## What it does
    On sampled steps from step 8 on, takes the argmax of the classification loss's input
    (the logits) and keeps the class histograms of the last 6 sampled batches. A collapse
    starts when one class takes **≥ 95%** of the predictions in every one of those batches
    (at least 128 predictions in all) while it is far less frequent among the targets (its
    prediction share exceeds its target share by ≥ 30 points), and lasts as long as every
    further sampled batch is ≥ 95% one class. It is reported only when it **persists**:
    either the loss stops improving during it (no decrease in the sampled losses of the
    collapse: Mann–Kendall z > −1.645 and the last third's median not 1% below the first
    third's — the same test as L106), or it lasts through the end of the observed run. A
    phase of one-class predictions that ends while the loss still falls (common early in
    fine-tuning a head) is not reported. The finding says from which step to which step
    the collapse was seen. Token targets (as many classes as the rows of an ``nn.Embedding``
    of the model: a language model's vocabulary) are left out: predicting the most frequent
    token everywhere is the unigram phase every language model goes through, and a loss
    that stays there is L106's to report.

    ## Why is this bad?
    A classifier that answers the same class for every input has stopped using its input:
    typical causes are dead ReLUs after a too-large learning rate, an exploded layer
    saturating the logits, features zeroed by a bug upstream, or a loss that rewards the
    majority class. The loss plateaus at the entropy of the label distribution and looks
    merely "slow", while the accuracy equals the frequency of that class.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)   # the ReLUs die in a few steps
    ```

    ## Use instead
    Lower the learning rate (or warm it up), check the inputs reaching the model, and
    check the loss and its labels. Thresholds: 95% of the predictions in each of at least 6
    sampled batches, and 30 points above the class's share of the targets — so a model that
    predicts the majority class of targets that are themselves 90% one class stays silent
    (that skew is D111 label-imbalance).

    ## References
    - Amazon SageMaker Debugger, ``Confusion`` and ``ClassImbalance`` rules (per-class prediction accuracy): https://docs.aws.amazon.com/sagemaker/latest/dg/debugger-built-in-rules.html
    - Karpathy, "A Recipe for Training Neural Networks" (verify the network predicts more than the prior): https://karpathy.github.io/2019/04/25/recipe/
    """

    code = "L109"
    name = "prediction-collapse"
    severity = Severity.WARNING
    summary = "the model predicts one class for nearly all samples"
    fix = "lower the learning rate (or add warm-up), check for dead activations and for inputs zeroed upstream"
    WARMUP_STEPS = 8
    WINDOW = 6

    def __init__(self, session) -> None:
        super().__init__(session)
        self._windows: dict[Location | None, deque] = {}
        self._collapses: dict[Location | None, _Collapse] = {}
        self._last_sampled: dict[Location | None, int] = {}
        self._tokens: dict[Location | None, bool] = {}
        self._reported = False

    @sampled_only
    def on_loss(self, event: LossComputed) -> None:
        if self._reported or not event.sampled or event.step < self.WARMUP_STEPS:
            return
        where = event.location
        histograms = class_histograms(event)
        if histograms is None:
            return
        self._last_sampled[where] = event.step
        tokens = self._tokens.get(where)
        if tokens is None:
            tokens = self._tokens[where] = targets_are_tokens(self.session, len(histograms[1]))
        if tokens:
            return  # a language model first learns the unigram prior: its most frequent token everywhere
        window = self._windows.setdefault(where, deque(maxlen=self.WINDOW))
        predictions = histograms[1]
        if not sum(predictions) or max(predictions) / sum(predictions) < 0.95:
            window.clear()  # this batch uses more than one class: any collapse so far was transient
            self._collapses.pop(where, None)
            return
        loss = _scalar(event.output)  # one host copy, on collapsed sampled batches only
        window.append((event.step, histograms, loss))
        if len(window) < self.WINDOW:
            return
        collapse = self._collapses.get(where)
        if collapse is None:
            if collapse_verdict([h for _, h, _ in window]) is None:
                return
            first_step, first_histograms, first_loss = window[0]
            collapse = _Collapse(first_step, first_step, 1, list(first_histograms[1]), list(first_histograms[0]),
                                 [first_loss])
            for step, h, value in list(window)[1:]:
                collapse.add(step, h, value)
            self._collapses[where] = collapse
        elif max(range(len(predictions)), key=lambda i: predictions[i]) != collapse.shares()[0]:
            # Another class now takes every prediction: a new phase, judged on its own batches.
            del self._collapses[where]
            window.clear()
            window.append((event.step, histograms, loss))
            return
        else:
            collapse.add(event.step, histograms, loss)
        stalled = loss_stopped_improving(collapse.losses, min_points=self.WINDOW)
        if stalled is not None:
            self._report(where, collapse, stalled=stalled)

    def on_run_end(self, event: RunEnd) -> None:
        if self._reported:
            return
        final_step = max(self.session.step, 0)
        for where, collapse in self._collapses.items():
            if collapse.last != self._last_sampled.get(where):
                continue
            # Persisted to the end of what was observed: the steps after the last sampled batch
            # (not observed) are no more than the collapse itself lasted.
            if final_step - collapse.last > max(collapse.last - collapse.start, 1):
                continue
            self._report(where, collapse, final_step=final_step)
            return

    def _report(self, where: Location | None, collapse: _Collapse, *,
                stalled: tuple[float, float] | None = None, final_step: int | None = None) -> None:
        self._reported = True
        top, predicted_share, target_share = collapse.shares()
        total = sum(collapse.predicted)
        span = (f"from step {collapse.start} to step {collapse.last} ({collapse.batches} sampled batches, at "
                f"least 95% in each)")
        if stalled is not None and not math.isfinite(stalled[0]):
            why = f"and the loss is not finite ({collapse.losses[-1]}) on the last {self.WINDOW} of them"
        elif stalled is not None:
            z, ratio = stalled
            why = (f"and the loss stopped improving meanwhile (Mann–Kendall z = {z:.2f} over the last "
                   f"{len(collapse.losses)} of those losses, a decrease needs z < {NOT_DECREASING_Z}; last-third median "
                   f"{ratio:.3f}× the first third's)")
        else:
            why = (f"and it lasted through the end of the observed run (the last sampled batch; the run ended at "
                   f"step {final_step})")
        self.report(
            f"The model predicted class {top} for {predicted_share:.1%} of {total} samples {span}, while class "
            f"{top} is {target_share:.1%} of the targets, {why}: its predictions no longer depend on the input.",
            location=where,
            evidence={"predicted_class": top, "prediction_share": round(predicted_share, 4),
                      "target_share": round(target_share, 4), "predictions": total,
                      "from_step": collapse.start, "to_step": collapse.last, "sampled_batches": collapse.batches,
                      "loss_trend_z": round(stalled[0], 3) if stalled and math.isfinite(stalled[0]) else None},
            step=collapse.start,
        )


def _scalar(value: object) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        with torch.no_grad():
            return float(value.detach().float())
    return math.nan
