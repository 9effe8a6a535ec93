"""Mixed precision with a GradScaler: O110 clipping before unscale_, O111 scale collapse."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch

from nndoctor.checks._params import named_params_of, optimizer_params
from nndoctor.core.events import GradClip, ScalerStep
from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register


def _scale_value(scaler: Any) -> float | None:
    try:
        return float(scaler.get_scale())
    except Exception:  # noqa: BLE001 - a scaler in an odd state: the number is optional
        return None


@register
class ClipBeforeUnscale(Check):
    """
    ## What it does
    Watches ``torch.nn.utils.clip_grad_norm_`` and ``clip_grad_value_``. When a GradScaler
    scaled this step's loss (``scaler.scale(loss).backward()``) and the optimizer that owns
    the clipped parameters has not been unscaled yet (no ``scaler.unscale_(optimizer)``
    before the clip), the gradients being clipped are still multiplied by the scale. The
    finding gives the scale, the threshold the clip really applied, and the norm it measured.

    ## Why is this bad?
    ``GradScaler`` multiplies the loss by a large factor (65536 at the start) so float16
    gradients do not underflow; ``scaler.step`` divides the gradients back before the update.
    Clipping in between sees gradients ``scale`` times too large: ``clip_grad_norm_(…, 1.0)``
    then clips to a true norm of ``1/65536`` — every step is shrunk to almost nothing and
    the model barely trains — and ``clip_grad_value_`` cuts values at ``clip_value/scale``.
    Because the scale changes during training (halved on overflow, doubled every 2000
    steps) the effective threshold drifts as well. PyTorch's AMP examples call
    ``scaler.unscale_(optimizer)`` before clipping for exactly this reason.

    ## Example
    ```python
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Use instead
    ```python
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)                # knows the gradients are already unscaled
    scaler.update()
    ```
    There is no threshold: the finding is exact (the scaler's own per-optimizer state says
    whether ``unscale_`` ran).

    ## References
    - PyTorch AMP examples, "Gradient clipping" (unscale_ before clipping): https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-clipping
    - PyTorch docs, ``GradScaler.unscale_``: https://pytorch.org/docs/stable/amp.html#torch.amp.GradScaler.unscale_
    """

    code = "O110"
    name = "clip-before-unscale"
    severity = Severity.ERROR
    summary = "gradient clipping applied to GradScaler-scaled gradients (no unscale_ first)"
    fix = "call scaler.unscale_(optimizer) after backward() and before clip_grad_norm_/clip_grad_value_"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._reported = False

    def on_grad_clip(self, event: GradClip) -> None:
        if self._reported or not event.scaled:
            return
        self._reported = True
        scale = _scale_value(event.scaler) if event.scaler is not None else None
        evidence: dict[str, Any] = {"function": event.function, "limit": event.limit, "scale": scale}
        numbers = ""
        if scale and event.limit is not None:
            effective = event.limit / scale
            evidence["effective_limit"] = effective
            numbers = (f" With the scale at {scale:g}, {event.function}({event.limit:g}) really limits the "
                       f"{'norm' if event.function == 'clip_grad_norm_' else 'values'} to {effective:.3g}.")
        norm = event.total_norm
        if isinstance(norm, torch.Tensor) and norm.numel() == 1 and scale:
            measured = float(norm.detach())
            evidence["measured_norm"] = measured
            evidence["true_norm"] = measured / scale
            numbers += (f" The norm it measured, {measured:.4g}, is the scaled one: the true gradient norm "
                        f"is {measured / scale:.4g}.")
        self.report(
            f"{event.function} clipped gradients that a GradScaler had scaled: scaler.unscale_(optimizer) "
            f"was not called between backward() and the clip, so clipping works on gradients multiplied "
            f"by the loss scale.{numbers}",
            location=event.location, evidence=evidence, step=event.step,
        )


def scaler_collapse_verdict(skips: list[bool], *, consecutive: int = 16, window: int = 100,
                            rate: float = 0.2, min_steps: int = 50) -> str | None:
    """Why the scaler's history is a collapse (None: healthy).

    ``skips`` is the skipped flag of each ``scaler.step``, oldest first. Healthy training
    skips a few steps at the start (the scale falls from 65536 to what the gradients allow)
    and about one step per growth interval (2000) after.
    """
    run = 0
    for skipped in reversed(skips):
        if not skipped:
            break
        run += 1
    if run >= consecutive:
        return f"the last {run} scaler steps were all skipped"
    if len(skips) >= min_steps:
        recent = skips[-window:]
        share = sum(recent) / len(recent)
        if share >= rate:
            return f"{sum(recent)} of the last {len(recent)} scaler steps were skipped ({share:.0%})"
    return None


@register
class GradScalerCollapse(Check):
    """
    ## What it does
    Counts, for every ``scaler.step(optimizer)``, whether the scaler skipped the optimizer
    step because the gradients held Inf/NaN (the optimizer's step count did not move — no
    extra synchronisation). It reports when **16 consecutive** steps were skipped (the scale
    has been halved 16 times: 65536 → 1) or, after 50 scaler steps, when **≥ 20%** of the
    last 100 were skipped. At that moment it reads the gradients once and names the
    parameters whose gradient is non-finite (the first in model order first).

    ## Why is this bad?
    A skipped step updates nothing. A healthy scaler skips a handful of steps at the start,
    while the scale falls to a value the gradients tolerate, then about one step per growth
    interval (2000 steps). When gradients are Inf/NaN whatever the scale — an operation
    whose derivative is infinite (``sqrt`` or ``log`` at 0, a division by a zero norm), or a
    float16 overflow in the forward pass — every step is skipped, the scale collapses toward
    0, the loss stays flat and nothing says why: the scaler hides the non-finite gradients
    that would otherwise be reported.

    ## Example
    ```python
    norm = torch.sqrt((features ** 2).sum(dim=1))       # infinite derivative where features = 0
    scaler.scale(loss).backward()
    scaler.step(optimizer)                             # skipped, step after step
    scaler.update()
    ```

    ## Use instead
    Fix the operation that produces the non-finite gradient (``torch.sqrt(x + eps)``,
    ``F.normalize``, ``torch.clamp`` before ``log``), compute the overflowing part in float32
    (``with torch.autocast(device_type, enabled=False):``), or train in bfloat16, which has
    float32's range and needs no scaler. Thresholds: 16 consecutive skips, or 20% of 100
    steps; a healthy run skips well under 1% after its first steps.

    ## References
    - PyTorch docs, Automatic Mixed Precision, ``GradScaler`` (skipped steps, backoff and growth): https://pytorch.org/docs/stable/amp.html#gradient-scaling
    - PyTorch AMP examples: https://pytorch.org/docs/stable/notes/amp_examples.html
    """

    code = "O111"
    name = "grad-scaler-collapse"
    severity = Severity.ERROR
    summary = "GradScaler scale keeps falling / many skipped steps for non-finite gradients"
    fix = ("make the named gradient finite (add an epsilon inside sqrt/log/division, compute the overflowing "
           "part in float32) or train in bfloat16")
    HISTORY = 400

    def __init__(self, session) -> None:
        super().__init__(session)
        self._skips: deque[bool] = deque(maxlen=self.HISTORY)
        self._total = 0
        self._skipped = 0
        self._reported = False

    def on_scaler_step(self, event: ScalerStep) -> None:
        if self._reported:
            return
        self._skips.append(event.skipped)
        self._total += 1
        self._skipped += event.skipped
        if not event.skipped:
            return
        reason = scaler_collapse_verdict(list(self._skips))
        if reason is None:
            return
        self._reported = True
        names = self._nonfinite_gradients(event.optimizer)
        scale = _scale_value(event.scaler)
        culprit = (f" Non-finite gradients: {', '.join(names[:3])}"
                   f"{f' (+{len(names) - 3} more)' if len(names) > 3 else ''}." if names else "")
        fallen = f", and the scale has fallen to {scale:g}" if scale is not None else ""
        self.report(
            f"The GradScaler keeps skipping optimizer steps because the gradients are Inf/NaN: {reason} "
            f"({self._skipped} of {self._total} in all){fallen}.{culprit} The model is not being updated.",
            location=event.location,
            evidence={"skipped_steps": self._skipped, "scaler_steps": self._total, "scale": scale,
                      "nonfinite_gradients": names[:8], "first_nonfinite": names[0] if names else None},
            step=event.step,
        )

    def _nonfinite_gradients(self, optimizer: Any) -> list[str]:
        """Parameters (model order) whose gradient holds Inf/NaN: one read, at report time."""
        params = [p for p in optimizer_params(optimizer) if p.grad is not None and not p.grad.is_sparse]
        if not params:
            return []
        names = named_params_of(self.session.state.trained_roots() or list(self.session.state.roots))
        with torch.no_grad():
            grads = [p.grad.detach() for p in params if p.grad is not None]  # every one (filtered above)
            flags = torch.stack([torch.isfinite(g).all().to("cpu") for g in grads]).tolist()
        order = {pid: i for i, pid in enumerate(names)}
        bad = [p for p, ok in zip(params, flags) if not ok]
        bad.sort(key=lambda p: order.get(id(p), math.inf))
        return [names.get(id(p), f"param{list(p.shape)}") for p in bad]
