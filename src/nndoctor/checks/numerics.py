"""Numerics and activations: N102 non-finite gradients, N103 dead ReLUs, N104 saturated
sigmoid/tanh, N105 float16 autocast without a GradScaler (N101 is in ``nonfinite_loss``)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from nndoctor.checks._params import scaler_enabled
from nndoctor.core.events import Forward, ModuleOutput, RunEnd, StepStart
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.rules import dead_units
from nndoctor.core.subscribers import model_forwards_only, sampled_only
from nndoctor.instrument.numerics_probe import cached_gradient_stats
from nndoctor.instrument.stats import first_plain_tensor


# -- N102 ----------------------------------------------------------------------------------------
@register
class NonfiniteGradients(Check):
    """
    ## What it does
    At sampled ``optimizer.step()`` calls, looks for NaN/Inf gradients (from the shared,
    once-per-step gradient norms) and names the first parameter, in model order, that has
    one, and how many parameter tensors are affected.

    Steps that a ``GradScaler`` skips are not reported: ``scaler.step(optimizer)`` does not
    call ``optimizer.step()`` when it found Inf/NaN, which is mixed precision working as
    designed. Non-finite gradients *reaching* ``optimizer.step()`` are always a bug.

    ## Why is this bad?
    The step writes NaN into the weights; from the next forward on the loss is NaN and
    training is over. When the loss itself is finite, the cause is in the
    backward pass: ``sqrt``/``norm`` of an exact zero, ``pow`` with a fractional exponent
    at 0, a custom ``autograd.Function``, or float16 overflow without loss scaling.

    ## Example
    ```python
    dist = (a - b).norm(dim=1)        # gradient of norm at 0 is NaN
    loss = dist.mean(); loss.backward(); optimizer.step()
    ```

    ## Use instead
    ```python
    dist = ((a - b).pow(2).sum(dim=1) + 1e-12).sqrt()
    ```
    With float16 use ``torch.amp.GradScaler`` and ``scaler.step(optimizer)``; clip with
    ``torch.nn.utils.clip_grad_norm_(..., error_if_nonfinite=True)`` to fail early.

    ## References
    - PyTorch docs, "Automatic Mixed Precision examples" (GradScaler skips Inf/NaN steps): https://pytorch.org/docs/stable/notes/amp_examples.html
    """

    code = "N102"
    name = "nonfinite-gradients"
    severity = Severity.ERROR
    summary = "NaN/Inf gradients reach optimizer.step() (outside GradScaler skip steps)"
    fix = "find the op whose backward produces NaN (norm/sqrt at 0, custom Function), add eps or clamp; use GradScaler with float16"

    @sampled_only
    def on_step_start(self, event: StepStart) -> None:
        if not event.sampled or event.has_closure:
            return
        stats = cached_gradient_stats(event, self.session)
        if stats is None or not stats.nonfinite:
            return
        bad = stats.nonfinite
        first = stats.names[bad[0]]
        scaler = self.session.state.scaler() if self.session.state.scaler else None
        note = (" A GradScaler is in use but optimizer.step() was called directly: call "
                "scaler.step(optimizer) so Inf/NaN steps are skipped." if scaler is not None else "")
        self.report(
            f"{len(bad)} of {len(stats.names)} gradient tensors hold NaN/Inf at "
            f"{type(event.optimizer).__name__}.step() (step {event.step}); first in model order: "
            f"{first}. The step writes NaN into the weights.{note}",
            location=event.location,
            evidence={"first_parameter": first, "nonfinite_parameters": [stats.names[i] for i in bad[:10]],
                      "count": len(bad), "total": len(stats.names)},
            step=event.step,
        )


# -- N103 / N104: activation statistics ----------------------------------------------------------------
RELU_TYPES = (nn.ReLU, nn.ReLU6)
SATURATING_TYPES = (nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Hardsigmoid)


def unit_axis(shape: tuple[int, ...]) -> int | None:
    """The axis of "units" of an activation: features (last) for 2-D/3-D, channels for 4-D/5-D."""
    if len(shape) in (2, 3):
        return len(shape) - 1
    if len(shape) in (4, 5):
        return 1
    return None


def active_units(output: torch.Tensor) -> torch.Tensor | None:
    """Per-unit booleans: was the unit positive for any sample/position of this batch?

    Stays on the output's device (one max reduction, no mask, no sync); the window is read
    back once, at the end of the run.
    """
    axis = unit_axis(tuple(output.shape))
    if axis is None:
        return None
    with torch.no_grad():
        dims = [d for d in range(output.dim()) if d != axis]
        return output.detach().amax(dim=dims) > 0


def dead_fraction(active: torch.Tensor) -> float:
    """Fraction of units never active over the accumulated window."""
    return 1.0 - float(active.float().mean())


@dataclass
class _UnitWindow:
    active: torch.Tensor
    samples: int
    batches: int
    location: Location | None
    module_type: str


@register
class DeadRelu(Check):
    """
    ## What it does
    On sampled training forwards, records for every ``nn.ReLU``/``nn.ReLU6`` layer which
    units (features of 2-D/3-D outputs, channels of 4-D/5-D outputs) were positive for at
    least one sample (the first 32 samples of each sampled batch: a live unit is positive
    for about half of its inputs, so 32 samples × every position are plenty to see it, and
    the reduction reads a quarter of a batch-128 activation instead of all of it). At the
    end of the run it reports layers where **at least 90%** of the units were never active
    over the last sampled batches (at least 64 samples in 4 batches).

    Known limits and false positives: functional ``F.relu`` calls are not modules and are
    not seen; for 3-D outputs the last axis is taken as the features (Linear on sequences),
    so a ``Conv1d`` + ``ReLU`` counts positions instead of channels; a layer whose input
    is legitimately almost always negative (rare by design) would be reported.

    On Keras 3 (torch and TensorFlow backends) the same thresholds apply after each
    ``fit(x, ...)`` on arrays: the first 4 batches of 32 training samples are run through the
    model's layers with ``Layer.stateless_call`` (nothing is assigned; random layers run in
    inference mode), and the units (last axis: channels-last) of every ``ReLU`` layer and
    every layer built with ``activation="relu"``/``"relu6"`` that stay at 0 are counted. Models
    without a layer graph (subclassed), ``fit`` on a dataset or generator, and custom
    ``GradientTape`` loops are not covered.

    ## Why is this bad?
    A ReLU unit that outputs 0 for every input gets zero gradient and never recovers: the
    layer's capacity is gone. It happens after a too-large learning rate step pushed the
    biases very negative, or with a bad initialisation. A healthy ReLU layer at
    initialisation has about half of its outputs active and almost no unit inactive on a
    whole batch: 90% dead units is far outside normal training.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)   # one huge step kills the units
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ```
    or ``nn.LeakyReLU``/``nn.GELU``, Kaiming initialisation, BatchNorm before the ReLU.

    Threshold: Amazon SageMaker Debugger's ``DeadRelu`` rule fires when more than 50% of a
    layer's ReLUs are inactive (``threshold_layer`` 50). nndoctor waits for 90%: a layer
    with half its units silent on a few batches can be healthy (sparse features, a class
    that is absent from those batches), while 90% never active is far from any normal
    training — a false alarm costs more trust than a late report.

    ## References
    - Amazon SageMaker Debugger, ``DeadRelu`` rule (``threshold_layer`` 50%): https://docs.aws.amazon.com/sagemaker/latest/dg/debugger-built-in-rules.html#dead-relu
    - Lu et al., "Dying ReLU and Initialization: Theory and Numerical Examples" (2019): https://arxiv.org/abs/1903.06733
    - CS231n notes, "Neural Networks Part 1" (dead ReLUs, "as much as 40% of your network can be dead"): https://cs231n.github.io/neural-networks-1/
    - Keras, ``Layer.stateless_call``: https://keras.io/api/layers/base_layer/#statelesscall-method
    """

    code = "N103"
    name = "dead-relu"
    severity = Severity.WARNING
    summary = "a ReLU layer with ≥90% of units never active"
    fix = "lower the learning rate, use Kaiming init or LeakyReLU/GELU, or add normalisation before the ReLU"
    heuristic = True
    DEAD_FRACTION = dead_units.DEAD_FRACTION
    MIN_SAMPLES = dead_units.MIN_SAMPLES
    MIN_BATCHES = dead_units.MIN_BATCHES
    WINDOW = 8
    SAMPLES_PER_BATCH = dead_units.SAMPLES_PER_BATCH

    def __init__(self, session) -> None:
        super().__init__(session)
        self._windows: dict[str, deque[tuple[torch.Tensor, int]]] = {}
        self._info: dict[str, tuple[Location | None, str]] = {}

    def on_module_output(self, event: ModuleOutput) -> None:
        module = event.module
        if not isinstance(module, RELU_TYPES) or not module.training or not torch.is_grad_enabled():
            return
        out = first_plain_tensor(event.output)
        if out is None or not out.is_floating_point() or out.dim() < 2:
            return
        # The first samples of the batch are enough to see a live unit (see the docs); the
        # reduction then reads a fraction of the activation instead of all of it.
        out = out[: self.SAMPLES_PER_BATCH]
        key = event.cache.get("nndoctor.relu_active")
        if key is None:
            key = event.cache["nndoctor.relu_active"] = active_units(out)
        if key is None:
            return
        name = f"{type(event.root).__name__}.{event.qualname}"
        window = self._windows.setdefault(name, deque(maxlen=self.WINDOW))
        if window and window[-1][0].shape != key.shape:
            window.clear()
        axis = unit_axis(tuple(out.shape))
        if axis is None:  # not reached: active_units found no unit axis either
            return
        window.append((key, out.numel() // max(1, out.shape[axis])))
        if name not in self._info:
            self._info[name] = (event.location, type(module).__name__)

    def on_run_end(self, event: RunEnd) -> None:
        for name, window in self._windows.items():
            verdict = dead_verdict([a.cpu() for a, _ in window], sum(n for _, n in window),
                                   self.DEAD_FRACTION, self.MIN_SAMPLES, self.MIN_BATCHES)
            if verdict is None:
                continue
            dead, units = verdict
            location, kind = self._info[name]
            self.report(
                f"{name} ({kind}): {dead} of {units} units ({dead / units:.0%}) were never active "
                f"(output 0 for every sample) over the last {len(window)} sampled training batches "
                f"— threshold {self.DEAD_FRACTION:.0%}. These units get no gradient and cannot recover.",
                location=location,
                evidence={"layer": name, "dead_units": dead, "units": units,
                          "batches": len(window), "threshold": self.DEAD_FRACTION},
                step=event.step,
            )


def dead_verdict(actives: list[torch.Tensor], samples: int, threshold: float, min_samples: int,
                 min_batches: int) -> tuple[int, int] | None:
    """(dead units, units) when the union of activity leaves ≥ threshold of units dead."""
    if len(actives) < min_batches or samples < min_samples:
        return None
    union = actives[0].clone()
    for a in actives[1:]:
        union |= a
    units = union.numel()
    dead = units - int(union.sum())
    return (dead, units) if units and dead / units >= threshold else None


def saturation_fraction(output: torch.Tensor, module: Any) -> torch.Tensor | None:
    """Fraction of outputs within 1% of the activation's range from its limits.

    A 0-d tensor on the output's device (no sync); read back at the end of the run.
    """
    if isinstance(module, (nn.Sigmoid, nn.Hardsigmoid)):
        low, high = 0.0, 1.0
    elif isinstance(module, (nn.Tanh, nn.Hardtanh)):
        low = float(getattr(module, "min_val", -1.0))
        high = float(getattr(module, "max_val", 1.0))
    else:
        return None
    margin = 0.01 * (high - low)
    with torch.no_grad():
        x = output.detach()
        pinned = (x <= low + margin) | (x >= high - margin)
        return pinned.mean(dtype=torch.float32)


@register
class SaturatedActivations(Check):
    """
    ## What it does
    On sampled training forwards, measures for every *hidden* ``nn.Sigmoid``/``nn.Tanh``
    (and hard variants) the fraction of outputs within 1% of the range from a limit
    (sigmoid < 0.01 or > 0.99, tanh beyond ±0.98). It reports a layer whose mean saturated
    fraction over the last sampled batches (at least 4) is **≥ 50%**.

    Output layers are excluded — a layer whose output *is* the model's output — since a
    confident classifier's final sigmoid is meant to approach 0 and 1. Gates inside
    ``nn.LSTM``/``nn.GRU`` are not modules and are not measured. Known false positive: a
    hidden sigmoid used on purpose as a hard gate (attention masks, binarisation).

    ## Why is this bad?
    At 0.99 the derivative of a sigmoid is 0.0099 (25× below its maximum 0.25) and that of
    tanh at ±0.98 is 0.04 (25× below 1): when half a layer is pinned there, half the layer
    passes almost no gradient and learning stalls (Glorot & Bengio 2010 observed exactly
    this saturation of sigmoid layers). The usual cause is inputs on a large scale
    (unnormalised features or pixels 0–255) or too large initial weights.

    ## Example
    ```python
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    model(x_raw * 100)                     # features in the hundreds
    ```

    ## Use instead
    ```python
    x = (x_raw - mean) / std               # unit-scale inputs
    ```
    or Xavier initialisation for tanh/sigmoid, normalisation layers, ReLU-family activations.

    ## References
    - Glorot & Bengio, "Understanding the difficulty of training deep feedforward neural networks" (2010): https://proceedings.mlr.press/v9/glorot10a.html
    - LeCun et al., "Efficient BackProp" (1998), section 4.4 (input scaling and sigmoid saturation).
    """

    code = "N104"
    name = "saturated-activations"
    severity = Severity.WARNING
    summary = "sigmoid/tanh outputs pinned at their limits"
    fix = "normalise the inputs of the layer (standardise features, scale pixels), use Xavier init or normalisation layers"
    heuristic = True
    THRESHOLD = 0.5
    MIN_BATCHES = 4
    WINDOW = 8
    idle_handlers = ("forward",)  # from a saturating module's output (sampled steps) to the forward's end

    def __init__(self, session) -> None:
        super().__init__(session)
        self._pending: list[tuple[str, int, torch.Tensor, Location | None, str]] = []
        self._windows: dict[str, deque[torch.Tensor]] = {}
        self._info: dict[str, tuple[Location | None, str]] = {}

    def on_module_output(self, event: ModuleOutput) -> None:
        module = event.module
        if not isinstance(module, SATURATING_TYPES) or not torch.is_grad_enabled():
            return
        out = first_plain_tensor(event.output)
        if out is None or not out.is_floating_point():
            return
        fraction = saturation_fraction(out, module)
        if fraction is None:
            return
        name = f"{type(event.root).__name__}.{event.qualname}"
        location = event.location if name not in self._info else None
        if not self._pending:
            self.session.arm(self, "forward")
        self._pending.append((name, id(out), fraction, location, type(module).__name__))

    def on_forward(self, event: Forward) -> None:
        pending, self._pending = self._pending, []
        self.session.disarm(self, "forward")  # armed again by the next saturating module's output
        if event.is_loss or not pending:
            return
        outputs = {id(t) for t in _tensors(event.output)}
        for name, out_id, fraction, location, kind in pending:
            if out_id in outputs:
                continue  # the model's output layer: saturation there is confidence
            self._windows.setdefault(name, deque(maxlen=self.WINDOW)).append(fraction)
            if name not in self._info:
                self._info[name] = (location, kind)

    def on_run_end(self, event: RunEnd) -> None:
        for name, window in self._windows.items():
            fractions = torch.stack([f.float().cpu() for f in window]).tolist() if window else []
            mean = saturation_verdict(fractions, self.THRESHOLD, self.MIN_BATCHES)
            if mean is None:
                continue
            location, kind = self._info[name]
            self.report(
                f"{name} ({kind}): {mean:.0%} of its outputs sit within 1% of the activation's limits, "
                f"averaged over the last {len(window)} sampled training batches — threshold "
                f"{self.THRESHOLD:.0%}. Saturated units pass ~25× less gradient; the inputs of this "
                "layer are probably on too large a scale.",
                location=location,
                evidence={"layer": name, "saturated_fraction": round(mean, 4),
                          "batches": len(window), "threshold": self.THRESHOLD},
                step=event.step,
            )


def saturation_verdict(fractions: list[float], threshold: float, min_batches: int) -> float | None:
    """The mean saturated fraction when it reaches the threshold over enough batches."""
    if len(fractions) < min_batches:
        return None
    mean = sum(fractions) / len(fractions)
    return mean if mean >= threshold else None


def _tensors(value: Any, limit: int = 16) -> list[torch.Tensor]:
    from nndoctor.instrument.stats import tensors_in

    return tensors_in(value, limit)


# -- N105 ------------------------------------------------------------------------------------------------
def float16_autocast_active() -> str | None:
    """The device type whose autocast region is active with float16, if any."""
    for device in ("cuda", "cpu", "xpu", "mps"):
        try:
            if torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.float16:
                return device
        except (RuntimeError, TypeError, AttributeError):
            continue
    return None


@register
class Fp16WithoutGradScaler(Check):
    """
    ## What it does
    Notes training forwards of sampled steps (gradients enabled, a model an optimizer
    updates) that run under ``torch.autocast(..., dtype=torch.float16)`` or with float16 parameters, and
    reports at the next ``optimizer.step()`` when no enabled ``GradScaler`` has scaled a
    loss in the run. bfloat16 autocast is not reported: its exponent range is float32's.

    ## Why is this bad?
    float16's smallest normal number is 6e-5: small gradients underflow to zero and the
    affected weights stop learning, silently; large activations overflow to Inf. The
    ``GradScaler`` multiplies the loss before ``backward()`` so gradients stay
    representable, unscales them before the step, and skips steps with Inf/NaN.

    ## Example
    ```python
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    loss.backward(); optimizer.step()
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
    ```
    or ``dtype=torch.bfloat16`` on hardware that supports it (no scaler needed).

    ## References
    - PyTorch docs, "Automatic Mixed Precision" (gradient scaling): https://pytorch.org/docs/stable/amp.html#gradient-scaling
    - Micikevicius et al., "Mixed Precision Training" (2018): https://arxiv.org/abs/1710.03740
    """

    code = "N105"
    name = "fp16-without-grad-scaler"
    severity = Severity.WARNING
    summary = "float16 autocast training with no GradScaler"
    fix = "use torch.amp.GradScaler: scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update() — or autocast to bfloat16"

    # Armed once a float16 training forward was seen (sampled steps): the next step decides.
    idle_handlers = ("step_start",)

    def __init__(self, session) -> None:
        super().__init__(session)
        self._seen: tuple[str, Location | None, int] | None = None
        self._done = False

    @sampled_only  # a run that trains in float16 does so on every step
    @model_forwards_only
    def on_forward(self, event: Forward) -> None:
        if not event.sampled or self._done or self._seen is not None or event.is_loss or not event.grad_enabled:
            return
        device = float16_autocast_active()
        how = f"torch.autocast({device!r}, dtype=torch.float16)" if device else None
        if how is None:
            param = next(iter(event.module.parameters()), None)
            if param is not None and param.dtype == torch.float16 and param.requires_grad:
                how = "float16 parameters (model.half())"
        if how is not None and self.session.state.is_trained(event.module):
            self._seen = (how, event.location, event.step)
            self.session.arm(self, "step_start")

    def on_step_start(self, event: StepStart) -> None:
        if self._done or self._seen is None:
            return
        self._done = True
        self.session.unsubscribe(self, "step_start", "forward")  # decided once: no per-step call left
        ref = self.session.state.scaler
        scaler = ref() if ref is not None else None
        if scaler is not None and scaler_enabled(scaler):
            return
        how, location, step = self._seen
        disabled = " (a GradScaler exists but is disabled)" if scaler is not None else ""
        self.report(
            f"Training runs under {how} and {type(event.optimizer).__name__}.step() is reached with "
            f"no enabled GradScaler{disabled}: small float16 gradients underflow to 0 and stop "
            "learning silently, and Inf steps are not skipped.",
            location=location or event.location,
            evidence={"precision": how},
            step=step,
        )

