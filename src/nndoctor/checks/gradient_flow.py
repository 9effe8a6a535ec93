"""When gradients are cleared, applied and scaled: O101, O102, O103, O108."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from nndoctor.checks._params import (
    grad_slice,
    has_any_grad,
    optimizer_params,
    spread_sample,
    value_slice,
)
from nndoctor.core.events import Backward, LossComputed, ManualStep, StepEnd, StepStart, ZeroGrad
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import sampled_only


@register
class MissingZeroGrad(Check):
    """
    ## What it does
    At a sampled ``optimizer.step()``, keeps a small fingerprint of a spread sample of that
    optimizer's gradients. When a later ``backward()`` starts while those gradients are
    still there and unchanged (at least one sampled slice non-zero: a slice that is always
    zero, like the padding row of ``nn.Embedding(padding_idx=0)``, proves nothing either
    way and is skipped), and the same optimizer then steps again without any
    ``zero_grad()`` (of the optimizer, or of a module holding its parameters) in between,
    the step applied the accumulated sum of old and new gradients.

    Loops without an optimizer (``param.data.add_(-lr * param.grad)``, or ``p -= lr *
    p.grad`` under ``no_grad``) are watched the same way: their step boundary is the
    hand-written update, recognised at the next forward of the model, and the finding
    needs that update to have written the parameters (a gradient-only pass after training,
    such as a saliency map, is not an update).

    ## Why is this bad?
    ``backward()`` accumulates into ``.grad``. Without ``optimizer.zero_grad()`` (or
    ``model.zero_grad()``) every step applies the sum of all gradients so far: the
    effective learning rate grows with the step count and training diverges or stalls.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```
    Deliberate gradient accumulation (several ``backward()`` per ``step()``, then
    ``zero_grad()``) is not reported: the gradients are cleared after each step. In a
    hand-written loop, ``model.zero_grad()`` before the forward (or ``p.grad = None`` /
    ``p.grad.zero_()`` after the update) does the same.

    ## References
    - PyTorch docs, ``Optimizer.zero_grad``: https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html
    - pytorch/examples, ``regression/main.py`` (a hand-written update with ``fc.zero_grad()``): https://github.com/pytorch/examples/blob/main/regression/main.py
    """

    code = "O101"
    name = "missing-zero-grad"
    severity = Severity.ERROR
    summary = "gradients accumulate across optimizer steps: no zero_grad between steps"
    fix = ("call optimizer.zero_grad() once per step, before loss.backward() (model.zero_grad() in a loop "
           "without an optimizer)")

    def __init__(self, session) -> None:
        super().__init__(session)
        # Per stepper (an optimizer, or the model of a hand-written update loop; by id): the
        # fingerprint taken at its last sampled step, and the location of a backward() that
        # ran on top of those gradients.
        self._snapshots: dict[int, list[GradFingerprint]] = {}
        self._stale_at: dict[int, tuple[Location | None, int]] = {}
        self._owners: dict[int, weakref.ref] = {}

    def _follow_fingerprints(self) -> None:
        """Every step while a fingerprint waits for the next backward and step; with none to
        compare (every step but a sampled one and the next), sampled steps only: three calls
        fewer on the usual step."""
        self.session.every_step(self, bool(self._snapshots or self._stale_at), "zero_grad", "backward", "step_start")

    def on_step_start(self, event: StepStart) -> None:
        if not self._snapshots and not event.sampled:
            return  # the usual step: no fingerprint to compare (nor a stale backward, kept only with one)
        optimizer = event.optimizer
        stepper = f"{type(optimizer).__name__}.step()"
        self._step_boundary(optimizer, stepper, event, lambda: optimizer_params(optimizer),
                            sample=not event.has_closure)

    def on_manual_step(self, event: ManualStep) -> None:
        # The update already ran when this event comes (the next forward): the gradients it
        # used are still in .grad unless something cleared them in between.
        module = event.module
        stepper = f"hand-written update of {type(module).__name__}'s parameters"
        self._step_boundary(module, stepper, event,
                            lambda: [p for p in module.parameters() if p.requires_grad], sample=True,
                            manual=True)

    def _step_boundary(self, owner: Any, stepper: str, event: Any, params: Any, *, sample: bool,
                       manual: bool = False) -> None:
        key = id(owner)
        stale = self._stale_at.pop(key, None)
        snaps = self._snapshots.pop(key, None)
        known = self._owners.pop(key, None)
        if known is None or known() is not owner:
            # A new optimizer reusing a finished one's id (layer-wise phases): not its gradients.
            stale, snaps = None, None
        # A loop without an optimizer: the accumulated gradients did harm only if an update used
        # them (a later gradient-only pass, e.g. a saliency map, writes no parameter).
        if stale is not None and snaps and _same_grad_tensors(snaps) and (not manual or _written(snaps)):
            location, step = stale
            informative = sum(1 for snap in snaps if snap.nonzero)
            if manual:
                missing = (f"{type(owner).__name__}.zero_grad() (or p.grad = None after the update) is missing, "
                           "so gradients accumulate and every update applies their running sum")
                boundary = "the next update"
            else:
                missing = "zero_grad() is missing, so gradients accumulate and every step applies their running sum"
                boundary = "this step"
            self.report(
                f"Gradients from the previous {stepper} were still in .grad ({informative} sampled parameter "
                f"tensors unchanged and non-zero) when backward() ran again, and nothing cleared them before "
                f"{boundary}: {missing}.",
                location=location,
                evidence={"sampled_parameters_with_stale_grads": informative, "step": step,
                          "update": "manual" if manual else "optimizer"},
                step=step,
            )
        if not event.sampled or not sample:
            self._follow_fingerprints()
            return
        with_grads = [p for p in params() if p.grad is not None]
        fresh = fingerprints(spread_sample(with_grads), with_values=manual)
        # Zero gradient slices tell nothing (an embedding's padding row, a frozen feature): at
        # least one non-zero slice must show that the gradients were not cleared.
        if any(snap.nonzero for snap in fresh):
            self._snapshots[key] = fresh
            self._owners[key] = weakref.ref(owner)
        self._follow_fingerprints()

    def on_backward(self, event: Backward) -> None:
        for key, snaps in self._snapshots.items():
            if key not in self._stale_at and _unchanged(snaps):
                self._stale_at[key] = (event.location, event.step)

    def on_zero_grad(self, event: ZeroGrad) -> None:
        if not self._stale_at:
            return
        owner = event.owner
        if isinstance(owner, torch.optim.Optimizer):
            self._stale_at.pop(id(owner), None)
            return
        owned = {id(p) for p in owner.parameters()}
        for key in list(self._stale_at):
            snaps = self._snapshots.get(key) or []
            if any(snap.param() is not None and id(snap.param()) in owned for snap in snaps):
                del self._stale_at[key]


@dataclass(frozen=True)
class GradFingerprint:
    """What O101 remembers of one parameter at a step: its gradient's first values, which
    ``.grad`` tensor object held them, and (hand-written loops) its version and first values."""

    param: weakref.ref
    grad: torch.Tensor
    grad_id: int
    nonzero: bool
    version: int
    values: torch.Tensor | None


def fingerprints(params: list[torch.Tensor], *, with_values: bool) -> list[GradFingerprint]:
    """The fingerprint of each parameter that has a dense gradient; their ``nonzero`` flags
    (``g.any()``) read in one copy to the host per device (on a GPU each ``bool()`` of its own
    would be a synchronisation)."""
    slices = [(p, g) for p in params if (g := grad_slice(p)) is not None]
    by_device: dict[torch.device, list[int]] = {}
    for i, (_, g) in enumerate(slices):
        by_device.setdefault(g.device, []).append(i)
    nonzero = [False] * len(slices)
    for indices in by_device.values():
        flags = torch.stack([slices[i][1].any() for i in indices]).tolist()
        for i, flag in zip(indices, flags, strict=True):
            nonzero[i] = bool(flag)
    return [GradFingerprint(weakref.ref(p), g, id(p.grad), flag, p._version,
                            value_slice(p) if with_values else None)
            for (p, g), flag in zip(slices, nonzero, strict=True)]


def _unchanged(snaps: list[GradFingerprint]) -> bool:
    """Every sampled gradient is as it was at the step (nothing cleared it), and at least one of
    them is non-zero. An all-zero slice is skipped, not required: it cannot tell a cleared
    gradient from one that is always zero (the padding row of ``nn.Embedding(padding_idx=0)``)."""
    informative = 0
    for snap in snaps:
        p = snap.param()
        if p is None:
            return False
        now = grad_slice(p)
        if now is None or not torch.equal(now, snap.grad):
            return False
        informative += snap.nonzero
    return informative > 0


def _same_grad_tensors(snaps: list[GradFingerprint]) -> bool:
    """The .grad tensors are the very objects seen at the last step (not re-created after a
    manual ``p.grad = None``)."""
    for snap in snaps:
        p = snap.param()
        if p is None or p.grad is None or id(p.grad) != snap.grad_id:
            return False
    return True


def _written(snaps: list[GradFingerprint]) -> bool:
    """Some sampled parameter was written since the fingerprint: its version moved (in-place
    update under ``no_grad``) or its first values changed (``p.data`` writes keep the version)."""
    for snap in snaps:
        p = snap.param()
        if p is None:
            continue
        if p._version != snap.version or (snap.values is not None
                                          and not torch.equal(value_slice(p), snap.values)):
            return True
    return False


@register
class ZeroGradBeforeStep(Check):
    """
    ## What it does
    Flags ``optimizer.step()`` calls that follow ``backward()`` but come after a
    ``zero_grad()`` that cleared the gradients, so the step applies nothing.

    ## Why is this bad?
    The order ``backward(); zero_grad(); step()`` throws away every gradient just before
    it is used: the weights only change through weight decay or momentum and the loss
    does not go down (``zero_grad`` must come *before* backward).

    ## Example
    ```python
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
    ```

    ## Use instead
    ```python
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ```

    In a loop without an optimizer the step is the hand-written update: when
    ``model.zero_grad(set_to_none=False)`` runs after ``backward()`` and the update then
    writes the parameters (``p -= lr * p.grad`` under ``no_grad``: their version counters
    move) while every gradient is zero, the update applied nothing. (With the default
    ``set_to_none=True`` such an update fails on ``p.grad`` being None instead; a ``p.data``
    update keeps the version counters and is not seen.)

    ## References
    - PyTorch docs, "Taking an optimization step": https://pytorch.org/docs/stable/optim.html
    """

    code = "O102"
    name = "zero-grad-before-step"
    severity = Severity.ERROR
    summary = "gradients cleared between backward() and step(): the step applies nothing"
    fix = "call zero_grad() before loss.backward(), not between backward() and step()"

    def __init__(self, session) -> None:
        super().__init__(session)
        # Loops without an optimizer, per model (by id): at its last zero_grad(), the backward()
        # count and the version counters of a sample of its parameters.
        self._cleared: dict[int, tuple[weakref.ref, int, list[tuple[weakref.ref, int]]]] = {}

    @sampled_only  # on_manual_step reports a sampled update only, and its zero_grad() is in the same step
    def on_zero_grad(self, event: ZeroGrad) -> None:
        if not event.sampled:
            return
        owner = event.owner
        if isinstance(owner, torch.optim.Optimizer) or len(self.session.state.optimizers) or event.set_to_none:
            return
        params = [p for p in owner.parameters() if p.requires_grad]
        self._cleared[id(owner)] = (weakref.ref(owner), self.session.state.backwards_since_step,
                                    [(weakref.ref(p), p._version) for p in spread_sample(params)])

    def on_manual_step(self, event: ManualStep) -> None:
        record = self._cleared.pop(id(event.module), None)
        module = record[0]() if record is not None else None
        if record is None or module is None or module is not event.module:
            return
        _, backwards, versions = record
        # No backward() since that zero_grad() (so it came after the step's backward), and the
        # parameters were written after it: the update ran on the cleared gradients.
        if backwards != self.session.state.backwards_since_step or not event.sampled:
            return
        if not any((param := ref()) is not None and param._version != version for ref, version in versions):
            return
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        if not grads or any(bool(g.any()) for g in spread_sample(grads)):
            return
        self.report(
            f"{type(module).__name__}.zero_grad(set_to_none=False) ran after backward() and before the "
            "hand-written update of its parameters, which then applied all-zero gradients: the update "
            "changes nothing.",
            location=event.location,
            evidence={"update": "manual", "parameters_with_zero_gradients": len(grads)},
            step=event.step,
        )

    @sampled_only  # every test below only returns: asking whether the step is sampled first changes nothing
    def on_step_start(self, event: StepStart) -> None:
        if not event.sampled:
            return
        if event.has_closure or event.backwards_since_step == 0 or event.zero_grads_since_backward == 0:
            return
        params = optimizer_params(event.optimizer)
        grads = [p.grad for p in params if p.grad is not None]
        if grads and any(bool(g.any()) for g in spread_sample(grads)):
            return
        self.report(
            f"{type(event.optimizer).__name__}.step() runs after backward() but a zero_grad() call in "
            f"between cleared the gradients of all {len(params)} parameter tensors: the step applies nothing.",
            location=event.location,
            evidence={"backwards_since_last_step": event.backwards_since_step,
                      "zero_grad_calls_after_backward": event.zero_grads_since_backward},
            step=event.step,
        )


@register
class StepWithoutGradients(Check):
    """
    ## What it does
    Flags ``optimizer.step()`` when none of the optimizer's parameters has a gradient and
    no ``zero_grad()`` explains it (that case is O102).

    ## Why is this bad?
    The step does nothing: ``backward()`` was never called, was called on a loss that
    does not depend on these parameters, or the optimizer was built on another copy of
    the model. Training silently does not happen for these parameters.

    ## Example
    ```python
    loss = criterion(model(x), y)
    optimizer.step()          # backward() forgotten
    ```

    ## Use instead
    ```python
    loss.backward()
    optimizer.step()
    ```
    Runs on every step until the loop has settled (64 steps in a row with a backward() and
    gradients), then on sampled steps, and on every step again from the moment the loop
    changes: an optimizer step with no ``backward()`` since the last one, or another model
    trained than the last one (a copy swapped in). A bug that starts late in a run is seen
    on the step it starts; a ``backward()`` that stops reaching the parameters for another
    reason, on the next sampled step.
    Closure-based optimizers (L-BFGS: ``optimizer.step(closure)``) compute their gradients
    inside ``step``: for them the closure's ``backward()`` counts, and the check looks at
    the end of the step whether the closure produced any gradient.

    ## References
    - PyTorch docs, ``torch.optim``: https://pytorch.org/docs/stable/optim.html
    - PyTorch docs, ``LBFGS.step(closure)``: https://pytorch.org/docs/stable/generated/torch.optim.LBFGS.html
    """

    code = "O103"
    idle_handlers = ("step_end",)  # armed by a step with a closure (L-BFGS): the usual step has none
    name = "step-without-gradients"
    severity = Severity.WARNING
    summary = "optimizer.step() while none of its parameters has a gradient"
    fix = "call loss.backward() before optimizer.step(), on a loss computed from these parameters"

    SETTLE_STEPS = 64  # steps in a row with a backward() and gradients: on sampled steps from then

    def __init__(self, session) -> None:
        super().__init__(session)
        # backward() calls so far, from the session's step ledger (not a handler on every
        # backward): a closure's run inside step() is the difference across the step.
        self._at_step_start: dict[int, int] = {}
        self._clean = 0  # steps in a row that had gradients
        session.state.on_loop_change.append(self._loop_changed)

    def _loop_changed(self) -> None:
        """A step without backward() (called before its step_start) or a new model trained."""
        if self._clean >= self.SETTLE_STEPS:
            self._clean = 0
            self.session.every_step(self, True, "step_start")

    def on_step_start(self, event: StepStart) -> None:
        if event.has_closure:
            self._clean = 0
            self._at_step_start[id(event.optimizer)] = self.session.state.backwards_with_values
            self.session.arm(self, "step_end")  # a closure's gradients are judged when its step ends
            return
        if event.backwards_since_step and event.zero_grads_since_backward:
            self._clean = 0
            return  # O102's case
        if has_any_grad(event.optimizer):
            self._clean += 1
            if self._clean >= self.SETTLE_STEPS and not event.sampled:
                self.session.every_step(self, False, "step_start")
            return
        self._clean = 0
        why = ("no backward() ran since the previous step" if event.backwards_since_step == 0
               else "the backward() did not reach them")
        self._report(event, why, event.backwards_since_step)

    def on_step_end(self, event: StepEnd) -> None:
        started = self._at_step_start.pop(id(event.optimizer), None)
        if not event.has_closure or started is None or has_any_grad(event.optimizer):
            return
        ran = self.session.state.backwards_with_values - started
        why = ("its closure ran no backward()" if ran == 0
               else "the closure's backward() did not reach them")
        self._report(event, why, ran)

    def _report(self, event, why: str, backwards: int) -> None:
        count = sum(len(g["params"]) for g in event.optimizer.param_groups)
        if not count:
            return
        self.report(
            f"{type(event.optimizer).__name__}.step() called while none of its {count} parameter "
            f"tensors has a gradient: {why}.",
            location=event.location,
            evidence={"parameters": count, "backwards_since_last_step": backwards},
            step=event.step,
        )


@register
class UnscaledGradientAccumulation(Check):
    """
    ## What it does
    Recognises gradient accumulation — several ``backward()`` calls on losses of
    *different batches* before one ``optimizer.step()`` — and checks whether the tensor
    given to each ``backward()`` is the loss function's output itself (or only multiplied
    by a GradScaler), i.e. not divided by the number of accumulated batches.

    ## Why is this bad?
    With ``k`` undivided mean losses the accumulated gradient is ``k`` times the gradient
    of the large batch you meant to simulate: the effective learning rate is ``k×`` too
    high. It does not crash; it trains worse, or diverges when ``k`` grows.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % 4 == 0:
            optimizer.step(); optimizer.zero_grad()
    ```

    ## Use instead
    ```python
        loss = criterion(model(x), y) / 4
    ```
    Several backward calls on losses of the *same* batch (a GAN discriminator's real and
    fake terms) are not accumulation and are not reported; neither are losses with
    ``reduction="sum"``, where dividing is a choice, or hand-written losses, whose scale
    nndoctor cannot know.

    ## References
    - Hugging Face Accelerate, "Gradient accumulation": https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation
    """

    code = "O108"
    name = "unscaled-gradient-accumulation"
    severity = Severity.WARNING
    summary = "k backward() per step with an undivided loss: effective LR × k"
    fix = "divide each accumulated loss by the number of accumulation steps: (loss / k).backward()"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._last_loss: weakref.ref | None = None
        self._last_reduction: str | None = None
        self._backwards: list[tuple[bool | None, int]] = []
        self._where: Location | None = None

    # The loss and backward records are read only by a sampled step's step_start (the only
    # place that reports): collected on sampled steps only, they cost an unsampled step nothing.
    @sampled_only
    def on_loss(self, event: LossComputed) -> None:
        if not event.sampled:
            return
        out = event.output
        if isinstance(out, torch.Tensor) and out.grad_fn is not None:
            self._last_loss = weakref.ref(out)
            self._last_reduction = event.options.get("reduction")

    @sampled_only
    def on_backward(self, event: Backward) -> None:
        if not event.sampled:
            return
        if event.index_since_step == 0:
            self._backwards = []
            self._where = event.location if event.sampled else None
        self._backwards.append((self._is_raw_loss(event.tensor), event.batches_since_last_backward))

    def _is_raw_loss(self, tensor) -> bool | None:
        loss = self._last_loss() if self._last_loss else None
        if loss is None or self._last_reduction == "sum" or not isinstance(tensor, torch.Tensor):
            return None
        if tensor is loss:
            return True
        scaler = self.session.state.scaler
        if scaler is not None and tensor.grad_fn is not None and type(tensor.grad_fn).__name__ == "MulBackward0":
            nexts = [fn for fn, _ in tensor.grad_fn.next_functions if fn is not None]
            return len(nexts) == 1 and nexts[0] is loss.grad_fn
        return False

    @sampled_only  # a step's backwards and its step_start share its step number
    def on_step_start(self, event: StepStart) -> None:
        if not event.sampled or not self._backwards:
            return
        records, self._backwards = self._backwards, []
        k = len(records)
        if k < 2 or not event.sampled:
            return
        if not all(raw for raw, _ in records) or not all(b > 0 for _, b in records[1:]):
            return
        self.report(
            f"{k} backward() calls on losses of {k} different batches were accumulated into one "
            f"optimizer step, each on the undivided loss: gradients are {k}× those of one batch of "
            f"{k}× the size, so the effective learning rate is {k}× what you set.",
            location=self._where or event.location,
            evidence={"backward_calls_per_step": k},
            step=event.step,
        )
