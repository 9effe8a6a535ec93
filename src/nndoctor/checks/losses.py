"""What the loss receives and how it evolves: L101–L106 (probabilities given to losses that
expect logits or log-probabilities, shape broadcasting, the initial loss, the loss trend).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from nndoctor.core.events import Backward, LossComputed, RunEnd, StepEnd
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.rules.initial_loss import (  # noqa: F401 - re-exported for the tests and preflight
    INITIAL_LOGIT_STD,
    expected_excess,
    initial_loss_excess,
    initial_loss_finding,
)
from nndoctor.core.rules.loss_trend import (  # noqa: F401 - re-exported for the tests
    DIVERGING_RATIO,
    DIVERGING_Z,
    MAX_TREND_VALUES,
    NOT_DECREASING_RATIO,
    NOT_DECREASING_Z,
    TREND_MIN_POINTS,
    TREND_MIN_STEPS,
    halved,
    loss_trend,
    mann_kendall_z,
    thirds_ratio,
    trend_sentence,
)
from nndoctor.core.subscribers import sampled_only
from nndoctor.instrument.inputs_probe import ClassAxisSummary, class_axis_summary
from nndoctor.instrument.loss_ledger import loss_ledger

# -- pure functions ---------------------------------------------------------------------

PROBABILITY_TOLERANCE = 1e-3


def looks_like_probabilities(summary: ClassAxisSummary, tolerance: float = PROBABILITY_TOLERANCE) -> bool:
    """Every value in [0, 1] and every row summing to 1 along the class axis (softmax output).

    Logits satisfy this only by construction, never by chance over a batch.
    """
    return summary.min >= -tolerance and summary.max <= 1 + tolerance and summary.sum_deviation <= tolerance


def looks_like_log_probabilities(summary: ClassAxisSummary, tolerance: float = PROBABILITY_TOLERANCE) -> bool:
    """Every value ≤ 0 and every row's logsumexp ≈ 0 (log_softmax output)."""
    return summary.max <= tolerance and summary.logsumexp_deviation <= tolerance


_VIEW_NODES = {"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "SqueezeBackward0",
               "SqueezeBackward1", "SqueezeBackward2", "UnsqueezeBackward0", "CloneBackward0",
               "ToCopyBackward0", "PermuteBackward0", "TransposeBackward0", "ContiguousBackward0"}


def grad_fn_name(tensor: Any, max_hops: int = 4) -> str:
    """Name of the autograd node that produced ``tensor``, looking through up to
    ``max_hops`` reshaping/copying nodes (``sigmoid(x).squeeze(1)`` is still a sigmoid)."""
    fn = getattr(tensor, "grad_fn", None)
    for _ in range(max_hops):
        if fn is None or type(fn).__name__ not in _VIEW_NODES:
            break
        nexts = [p for p, _ in getattr(fn, "next_functions", ()) if p is not None]
        if len(nexts) != 1:
            break
        fn = nexts[0]
    return type(fn).__name__ if fn is not None else ""


def in_unit_interval(minimum: float, maximum: float) -> bool:
    return minimum >= 0.0 and maximum <= 1.0


# Elementwise losses whose (input, target) broadcast silently (torch only warns).
BROADCASTING_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
                       "poisson_nll_loss", "binary_cross_entropy", "soft_margin_loss")


def broadcast_blowup(input_shape: Sequence[int], target_shape: Sequence[int]) -> tuple[int, ...] | None:
    """The broadcast shape when it holds more elements than either operand, else None."""
    if tuple(input_shape) == tuple(target_shape):
        return None
    try:
        shape = tuple(torch.broadcast_shapes(tuple(input_shape), tuple(target_shape)))
    except RuntimeError:
        return None
    size = math.prod(shape)
    if size > max(math.prod(input_shape), math.prod(target_shape)):
        return shape
    return None


_BROADCAST_OPS = {"SubBackward0", "AddBackward0", "MulBackward0", "DivBackward0", "RsubBackward1"}
# Producers that make a size-1 dimension on purpose (pairwise terms are written this way).
_EXPLICIT_SHAPING = {"UnsqueezeBackward0", "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0",
                     "ExpandBackward0", "IndexBackward0", "AsStridedBackward0", "TBackward0",
                     "PermuteBackward0", "TransposeBackward0"}


def outer_broadcast(out_shape: Sequence[int], operand_shape: Sequence[int]) -> bool:
    """The (N, 1) op (N,) → (N, N) signature: a column operand expanded into a square matrix."""
    return (len(out_shape) == 2 and len(operand_shape) == 2 and out_shape[0] == out_shape[1] >= 2
            and operand_shape[0] == out_shape[0] and operand_shape[1] == 1)


def hand_written_broadcasts(loss: Any, max_nodes: int = 24) -> list[tuple[str, tuple[int, ...], tuple[int, ...], str]]:
    """Walk the autograd graph from a loss toward the model (at most ``max_nodes`` nodes,
    breadth first) and return (op, output shape, operand shape, operand producer) for every
    elementwise op that blew a column operand up into a square matrix.

    Shapes come from each graph node's input metadata: no tensor is read, nothing syncs.
    Relies on ``Node._input_metadata`` (private API, present in torch ≥ 2.0); without it the
    walk finds nothing.
    """
    root = getattr(loss, "grad_fn", None)
    found: list[tuple[str, tuple[int, ...], tuple[int, ...], str]] = []
    if root is None:
        return found
    queue, seen = [root], set[int]()
    while queue and len(seen) < max_nodes:
        node = queue.pop(0)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        name = type(node).__name__
        nexts = list(getattr(node, "next_functions", ()))
        if name in _BROADCAST_OPS:
            try:
                out_shape = tuple(node._input_metadata[0].shape)
            except (AttributeError, IndexError, RuntimeError):
                out_shape = ()
            for producer, index in nexts:
                if producer is None or type(producer).__name__ == "AccumulateGrad":
                    continue
                try:
                    operand = tuple(producer._input_metadata[index].shape)
                except (AttributeError, IndexError, RuntimeError):
                    continue
                kind = type(producer).__name__
                if outer_broadcast(out_shape, operand) and kind not in _EXPLICIT_SHAPING:
                    found.append((name.replace("Backward0", "").replace("Backward1", "").lower(),
                                  out_shape, operand, kind))
        queue.extend(p for p, _ in nexts if p is not None)
    return found


# L106: Mann–Kendall trend test over the observed training losses (shared with Keras/TensorFlow).


# -- checks -----------------------------------------------------------------------------

def _is_training_loss(event: LossComputed) -> bool:
    output = event.output
    return isinstance(output, torch.Tensor) and output.requires_grad


@register
class SoftmaxBeforeCrossEntropy(Check):
    """
    ## What it does
    Flags `cross_entropy` / `nn.CrossEntropyLoss` inputs that are probabilities: produced
    directly by `softmax` (seen in the autograd graph), or all in [0, 1] with every row
    summing to 1 along the class axis (tolerance 1e-3). Both are read on sampled steps (every
    step of the first 16, then one in 100): the code that builds the loss is the same every step.

    ## Why is this bad?
    `CrossEntropyLoss` applies `log_softmax` itself. Given probabilities it computes a
    softmax of a softmax: the "logits" are squeezed into [0, 1], the loss can never go
    below about ln(C) − 1 + small, and gradients shrink by orders of magnitude; training
    stalls at a mediocre accuracy. The PyTorch docs say it: CrossEntropyLoss expects
    unnormalized logits, so no softmax is added by hand.

    A model that ends in softmax *for inference* but whose training path returns logits is
    fine and not reported — only what reaches the loss is examined. `log_softmax` before
    `cross_entropy` is harmless (log_softmax is idempotent) and not reported either.

    ## Example
    ```python
    model = nn.Sequential(backbone, nn.Linear(512, 10), nn.Softmax(dim=1))
    loss = nn.CrossEntropyLoss()(model(x), y)
    ```

    ## Use instead
    ```python
    model = nn.Sequential(backbone, nn.Linear(512, 10))       # logits
    loss = nn.CrossEntropyLoss()(model(x), y)
    probs = model(x).softmax(dim=1)                             # only for predictions
    ```

    ## References
    - PyTorch docs, `CrossEntropyLoss` ("input is expected to contain unnormalized logits"): https://pytorch.org/docs/stable/generated/torch.nn.CrossEntropyLoss.html
    """

    code = "L101"
    name = "softmax-before-cross-entropy"
    severity = Severity.ERROR
    summary = "CrossEntropyLoss receives probabilities (double softmax)"
    fix = "remove the softmax before CrossEntropyLoss and pass raw logits (apply softmax only for predictions)"

    @sampled_only
    def on_loss(self, event: LossComputed) -> None:
        if not event.sampled or event.function != "cross_entropy" or not isinstance(event.input, torch.Tensor):
            return
        producer = grad_fn_name(event.input)
        evidence: dict[str, Any] = {"input_produced_by": producer or None}
        if producer == "SoftmaxBackward0":
            reason = "its input comes straight from softmax"
        else:
            summary = class_axis_summary(event, "input", event.input)
            if summary is None or not looks_like_probabilities(summary):
                return
            reason = (f"every input value lies in [{summary.min:.3g}, {summary.max:.3g}] and each row sums to 1 "
                      f"(max deviation {summary.sum_deviation:.1e}) over {summary.classes} classes")
            evidence.update(min=summary.min, max=summary.max, row_sum_deviation=summary.sum_deviation)
        self.report(
            f"cross_entropy receives probabilities: {reason}. CrossEntropyLoss applies log_softmax "
            "itself, so this is a double softmax and gradients are squashed.",
            location=event.location, evidence=evidence, step=event.step,
        )


@register
class SigmoidBeforeLogitsLoss(Check):
    """
    ## What it does
    Flags `binary_cross_entropy_with_logits` / `nn.BCEWithLogitsLoss` inputs produced by
    `sigmoid` (`torch.sigmoid`, `nn.Sigmoid`, `special.expit`), read from the autograd
    graph on every call, looking through up to 4 reshaping nodes (`squeeze`, `view` …).

    The values alone are not used: logits confined to [0, 1] are common at initialisation
    (a discriminator with a small positive bias gives only values around 0.2 for many
    steps), so "no negative value" proves nothing. Under `torch.no_grad()` there is no
    graph and nothing is reported — a miss, not a false alarm.

    ## Why is this bad?
    The loss applies the sigmoid itself. Fed probabilities, it computes σ(σ(z)) ∈ [0.5, 0.73]:
    the model can never predict the negative class with confidence, the loss bottoms out
    around 0.31 for positives and 0.69 for negatives, and gradients vanish.

    ## Example
    ```python
    prob = torch.sigmoid(model(x))
    loss = nn.BCEWithLogitsLoss()(prob, y)
    ```

    ## Use instead
    ```python
    loss = nn.BCEWithLogitsLoss()(model(x), y)     # logits
    # or nn.BCELoss()(torch.sigmoid(model(x)), y), numerically weaker
    ```

    ## References
    - PyTorch docs, `BCEWithLogitsLoss` ("combines a Sigmoid layer and the BCELoss"): https://pytorch.org/docs/stable/generated/torch.nn.BCEWithLogitsLoss.html
    """

    code = "L102"
    name = "sigmoid-before-logits-loss"
    severity = Severity.ERROR
    summary = "BCEWithLogitsLoss receives sigmoid outputs"
    fix = "pass raw logits to BCEWithLogitsLoss (remove the sigmoid), or use BCELoss on probabilities"

    @sampled_only  # the input's producer is the same on every step of a loop
    def on_loss(self, event: LossComputed) -> None:
        if not event.sampled:
            return
        if event.function != "binary_cross_entropy_with_logits" or not isinstance(event.input, torch.Tensor):
            return
        producer = grad_fn_name(event.input)
        if producer != "SigmoidBackward0":
            return
        self.report(
            "binary_cross_entropy_with_logits receives probabilities: its input comes from sigmoid "
            f"(autograd node {producer}). The loss applies the sigmoid itself, so predictions are stuck "
            "in [0.5, 0.73].",
            location=event.location, evidence={"input_produced_by": producer}, step=event.step,
        )


@register
class NllWithoutLogSoftmax(Check):
    """
    ## What it does
    Flags `nll_loss` / `nn.NLLLoss` inputs that are not log-probabilities, on sampled
    steps: any value above 0 (raw logits — log-probabilities are ≤ 0), or rows of
    probabilities in [0, 1] summing to 1 (softmax instead of log_softmax). Tolerance 1e-3.
    Inputs produced by `log_softmax` are never reported.

    ## Why is this bad?
    `NLLLoss` only picks `-input[target]`; it expects `log_softmax` output. Given logits it
    rewards making the target logit large without any normalisation (the loss goes to −∞,
    the model learns nothing calibrated); given probabilities the loss is bounded in
    [−1, 0] and the gradients are tiny.

    ## Example
    ```python
    loss = F.nll_loss(model(x), y)                   # model returns logits
    ```

    ## Use instead
    ```python
    loss = F.nll_loss(F.log_softmax(model(x), dim=1), y)
    # or simply F.cross_entropy(model(x), y)
    ```

    ## References
    - PyTorch docs, `NLLLoss` ("obtaining log-probabilities … add a LogSoftmax layer"): https://pytorch.org/docs/stable/generated/torch.nn.NLLLoss.html
    """

    code = "L103"
    name = "nll-without-log-softmax"
    severity = Severity.ERROR
    summary = "NLLLoss receives values that are not log-probabilities"
    fix = "apply log_softmax(dim=1) before NLLLoss, or use cross_entropy on raw logits"

    @sampled_only
    def on_loss(self, event: LossComputed) -> None:
        if event.function != "nll_loss" or not event.sampled or not isinstance(event.input, torch.Tensor):
            return
        if grad_fn_name(event.input) == "LogSoftmaxBackward0":
            return
        summary = class_axis_summary(event, "input", event.input)
        if summary is None or looks_like_log_probabilities(summary):
            return
        if looks_like_probabilities(summary):
            reason = (f"its rows are probabilities (values in [{summary.min:.3g}, {summary.max:.3g}], each row "
                      "sums to 1): softmax was used instead of log_softmax")
        elif summary.max > PROBABILITY_TOLERANCE:
            reason = (f"it contains positive values up to {summary.max:.4g} (log-probabilities are ≤ 0): "
                      "these are raw logits")
        else:
            return  # ≤ 0 but not normalised: could be a deliberate custom log-likelihood
        self.report(
            f"nll_loss input is not log-probabilities: {reason}.",
            location=event.location,
            evidence={"min": summary.min, "max": summary.max, "row_sum_deviation": summary.sum_deviation,
                      "logsumexp_deviation": summary.logsumexp_deviation},
            step=event.step,
        )


@register
class BroadcastInLoss(Check):
    """
    ## What it does
    Two detectors for a prediction and a target whose shapes broadcast into a larger tensor:

    * loss functions (`mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss`, `kl_div`,
      `poisson_nll_loss`, `binary_cross_entropy`, `soft_margin_loss` and their modules):
      `input.shape != target.shape` and the broadcast shape has more elements than either
      (checked on every call, shapes only);
    * hand-written losses such as `((pred - y) ** 2).mean()`: on sampled steps, at
      `backward()`, a breadth-first walk of at most 24 nodes of the autograd graph from
      the loss looks for an elementwise sub/add/mul/div whose output is a square (N, N)
      matrix built from an (N, 1) operand — the (N, 1) vs (N,) accident. Shapes are read
      from the graph's metadata; no tensor is touched and nothing synchronises. This was
      chosen over patching `Tensor.__sub__`, which would cost every subtraction of the
      program. The finding points at the `backward()` line (the graph does not record
      where the subtraction was written). Operands shaped on purpose by
      `unsqueeze`/`view`/indexing (pairwise-distance losses) are not reported.

    ## Why is this bad?
    With `pred` (N, 1) and `y` (N,), `pred - y` is (N, N): every prediction is compared
    with every target, the loss is minimised by predicting the mean of the targets, and
    the model learns nothing per sample — without any error (torch only warns for the
    loss functions). PyTorch's broadcasting rules (each dimension equal, one
    of them 1, or missing) and how a 1-D tensor silently aligns to the right.

    ## Example
    ```python
    pred = model(x)                  # (N, 1)
    loss = ((pred - y) ** 2).mean()  # y: (N,)  -> (N, N)
    ```

    ## Use instead
    ```python
    loss = ((pred.squeeze(1) - y) ** 2).mean()   # or F.mse_loss(pred, y.unsqueeze(1))
    ```

    ## References
    - PyTorch broadcasting semantics: https://pytorch.org/docs/stable/notes/broadcasting.html
    """

    code = "L104"
    name = "broadcast-in-loss"
    severity = Severity.ERROR
    summary = "prediction/target shapes broadcast into a larger tensor inside the loss ((N,1) vs (N,) → (N,N))"
    fix = "give prediction and target the same shape (pred.squeeze(1) or target.unsqueeze(1))"

    @sampled_only  # the shapes are the same on every step of a loop
    def on_loss(self, event: LossComputed) -> None:
        if not event.sampled:
            return
        if event.function not in BROADCASTING_LOSSES:
            return
        inp, target = event.input, event.target
        if not isinstance(inp, torch.Tensor) or not isinstance(target, torch.Tensor):
            return
        shape = broadcast_blowup(inp.shape, target.shape)
        if shape is None:
            return
        self.report(
            f"{event.function} input {list(inp.shape)} and target {list(target.shape)} broadcast to "
            f"{list(shape)}: every prediction is compared with every target.",
            location=event.location,
            evidence={"input_shape": list(inp.shape), "target_shape": list(target.shape),
                      "broadcast_shape": list(shape)},
            step=event.step,
        )

    @sampled_only
    def on_backward(self, event: Backward) -> None:
        if not event.sampled or not isinstance(event.tensor, torch.Tensor) or event.tensor.numel() != 1:
            return
        found = hand_written_broadcasts(event.tensor)
        if not found:
            return
        op, out_shape, operand, producer = found[0]
        self.report(
            f"the loss being backpropagated contains a {op} that expands a {list(operand)} tensor "
            f"(produced by {producer}) into {list(out_shape)}: an (N, 1) prediction meets an (N,) target, "
            "so every prediction is compared with every target.",
            location=event.location,
            evidence={"op": op, "operand_shape": list(operand), "output_shape": list(out_shape),
                      "operand_producer": producer},
            step=event.step,
        )


@register
class InitialLossSuspicious(Check):
    """
    ## What it does
    Averages the classification losses (`cross_entropy`, `nll_loss`, mean reduction, with
    gradients) computed before the first optimizer step and compares them with ln(C), the
    loss of a model that knows nothing yet. It reports a first loss above the expected loss
    of i.i.d. logits z ~ N(0, σ²) with σ = 3 (simulated once per C with a private
    generator; e.g. ln C + 2.76 for C = 10) — an initial logit spread three times what
    standard initialisation gives (σ ≈ 0.3–1, loss ≈ ln C). Known false positives: a run resumed from a checkpoint that is
    confidently wrong on the new data (e.g. a new label mapping) — which is worth knowing too.

    On Keras 3 (torch and TensorFlow backends) the same rule reads the first batch's loss of a
    model's first ``fit`` (a sparse/categorical cross-entropy; C is the output width), and in
    custom loops the first eager call of a Keras cross-entropy loss object before any
    optimizer step, with logits of std 5 as the threshold (Keras's glorot-uniform default
    spreads a narrow head's logits more than PyTorch's, and the first loss is one batch).

    ## Why is this bad?
    A too-large initial loss means the network starts saturated: inputs not normalised,
    a bad initialisation scale, a final layer with a large bias, or a temperature/scale
    bug. The first hundreds of steps are spent undoing it, and softmax saturation can stall
    training entirely ("verify loss @ init", Karpathy's recipe).

    ## Example
    ```python
    model = nn.Linear(784, 10)
    nn.init.normal_(model.weight, std=1.0)        # logits with std ~28
    loss = F.cross_entropy(model(x), y)            # ~40 instead of ln(10) = 2.3
    ```

    ## Use instead
    ```python
    model = nn.Linear(784, 10)                     # default (Kaiming-uniform) init
    # and inputs normalised to unit scale
    ```

    ## References
    - A. Karpathy, "A Recipe for Training Neural Networks" (2019), "verify loss @ init".
    - Glorot & Bengio, "Understanding the difficulty of training deep feedforward neural networks", AISTATS 2010.
    """

    code = "L105"
    name = "initial-loss-suspicious"
    severity = Severity.WARNING
    heuristic = True
    summary = "first classification losses far from ln(C) (bad init, scaling or labels)"
    fix = "check input normalisation, the init scale of the last layer and the labels; the first loss should be near ln(C)"

    _MAX_LOSSES = 4

    def __init__(self, session) -> None:
        super().__init__(session)
        self._losses: list[float] = []
        self._classes = 0
        self._location: Location | None = None
        self._done = False

    def on_loss(self, event: LossComputed) -> None:
        if self._done or event.step > 0 or event.function not in ("cross_entropy", "nll_loss"):
            return
        if event.options.get("reduction", "mean") != "mean" or not _is_training_loss(event):
            return
        inp = event.input
        if not isinstance(inp, torch.Tensor) or inp.dim() == 0 or len(self._losses) >= self._MAX_LOSSES:
            return
        classes = int(inp.shape[1] if inp.dim() >= 2 else inp.shape[0])
        if self._classes and classes != self._classes:
            return
        self._classes = classes
        self._losses.append(float(event.output.detach().float()))  # step 0 is always sampled
        if self._location is None:
            self._location = event.location

    def on_step_end(self, event: StepEnd) -> None:
        self._conclude()

    def on_run_end(self, event: RunEnd) -> None:
        self._conclude()

    def _conclude(self) -> None:
        if self._done:
            return
        self._done = True
        self.session.unsubscribe(self, "loss", "step_end")  # step 0 is over
        found = initial_loss_finding(self._losses, self._classes)
        if found is None:
            return
        message, evidence = found
        self.report(message, location=self._location, evidence=evidence, step=0)


@register
class LossNotDecreasing(Check):
    """
    ## What it does
    Records the value of every loss passed to `backward()` without extra synchronisation
    (each value is copied into a small buffer on the loss's device and read on sampled
    steps) and, at the end of the run, applies the Mann–Kendall trend test to the sequence.
    With at least 30 values spanning at least 30 optimizer steps it reports:

    * **not decreasing**: no significant decrease (z > −1.645, one-sided 5%) *and* the
      median of the last third of the losses is not 1% below the median of the first third;
    * **diverging**: a significant increase (z > 2.326, one-sided 1%) *and* the last third's
      median at least 1.5× the first third's;
    * **diverged after a jump**: the median of the last third of the losses is at least 100×
      the first loss (the loss before any update), whatever the trend since: a learning rate
      far too high throws the loss up by orders of magnitude within a few steps, after which
      it may drift down again, which the trend test alone reads as a decrease.

    A loss whose first three values average at least 10× the median of the last third has
    already converged: the plateau that follows such a fall is not reported as "not
    decreasing" (the fall can be quick enough for the first third to lie on the plateau).

    Runs with several optimizers (GANs, whose losses need not decrease) and losses that go
    negative (log-likelihoods) are not examined. Known false positives: a run resumed at a
    plateau, reinforcement-learning objectives, a learning-rate warm-up longer than the run.

    On Keras 3 and TensorFlow the same test runs on the losses of ``fit`` — each batch's loss
    recovered from the running epoch mean that Keras gives its callbacks in ``logs["loss"]``
    (batch *b*'s loss is (b + 1)·mean_b − b·mean_(b−1)) — and on the losses given to
    ``tape.gradient`` in eager custom loops; a compiled training step (a ``tf.function`` that
    applies the optimizer) contributes the scalar loss it returns (the value, the first item of
    a tuple, or a dict's ``"loss"``), read after each call (on a GPU, on sampled steps only); a
    compiled step that returns no loss is not read. The finding names the ``model.fit(...)``,
    ``tape.gradient(...)`` or step-calling line. Keras guide, "Writing a training loop from
    scratch in TensorFlow": https://keras.io/guides/writing_a_custom_training_loop_in_tensorflow/

    ## Why is this bad?
    A loss that does not go down means nothing is being learned: learning rate far too low
    or too high, labels shuffled independently of the inputs, a frozen model, a bug
    between the model and the loss. NaN and exploding weights are often chased for days
    after the loss stopped improving; seeing the flat curve early saves the GPU-days.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-7)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)   # after an LR range test
    ```

    ## References
    - H. B. Mann, "Nonparametric tests against trend", Econometrica 1945; M. G. Kendall, Rank Correlation Methods, 1975.
    - Keras, ``Callback`` (``on_train_batch_end`` logs): https://keras.io/api/callbacks/base_callback/
    """

    code = "L106"
    name = "loss-not-decreasing"
    severity = Severity.WARNING
    heuristic = True
    summary = "no downward trend of the training loss over the observed window, or divergence"
    fix = "check the learning rate (LR range test), that labels match inputs, and that the optimizer updates the model"

    _MAX_VALUES = MAX_TREND_VALUES

    def __init__(self, session) -> None:
        super().__init__(session)
        # The session's loss ledger reads each loss once for L106, L107, L108 and N101 (one
        # item() on the CPU, one copy to pinned host memory on CUDA). The backward hook records
        # every loss given to backward() there (no handler call a step); the values are read
        # back on sampled steps and at the end, from this check's place in that sequence.
        self._ledger = loss_ledger(session, follow_backward=True)
        self._cursor = self._ledger.backward_count
        self._values: list[float] = []
        self._location: Location | None = None
        self._first_step: int | None = None
        self._most_optimizers = 0

    @sampled_only
    def on_backward(self, event: Backward) -> None:
        if not event.sampled:
            return
        # Several optimizers (a GAN's) make the loss curve meaningless; counted on sampled
        # steps (and at the end): a second optimizer that trains lives through them.
        self._count_optimizers()
        if self._location is None:
            first = self._ledger.backward_step(self._cursor)
            if first is not None:  # the first loss followed: its step, and this backward() call's place
                self._location, self._first_step = event.location, first
        self._flush()

    def _count_optimizers(self) -> None:
        self._most_optimizers = max(self._most_optimizers, len(self.session.state.optimizers))

    def _flush(self) -> None:
        # The only wait, on sampled steps (CUDA); a value the ledger dropped is left out.
        self._cursor, values = self._ledger.backward_values(self._cursor)
        for value in values:  # one at a time: the halving keeps the same pairs as on every step
            self._values.append(value)
            if len(self._values) > self._MAX_VALUES:  # halve the resolution, keep the whole window
                self._values = halved(self._values)

    def on_run_end(self, event: RunEnd) -> None:
        self._count_optimizers()
        self._flush()
        steps = event.step - (self._first_step or 0)
        if self._most_optimizers > 1 or steps < TREND_MIN_STEPS:
            return
        verdict = loss_trend(self._values)
        if verdict is None:
            return
        kind, z, ratio = verdict
        n = len(self._values)
        what = trend_sentence(kind, z, ratio, n, values=self._values)
        self.report(
            what + ".",
            location=self._location,
            evidence={"trend": kind, "mann_kendall_z": z, "jump_ratio" if kind == "jumped" else "thirds_ratio": ratio, "losses_observed": n,
                      "first": self._values[:3], "last": self._values[-3:]},
            step=self._first_step,
        )
