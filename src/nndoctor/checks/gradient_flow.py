"""When gradients are cleared, applied and scaled: O101, O102, O103, O108."""

from __future__ import annotations

import weakref

import torch

from nndoctor.checks._params import grad_slice, has_any_grad, optimizer_params, spread_sample
from nndoctor.events import Backward, LossComputed, StepEnd, StepStart, ZeroGrad
from nndoctor.findings import Location, Severity
from nndoctor.registry import Check, register


@register
class MissingZeroGrad(Check):
    """
    ## What it does
    At a sampled ``optimizer.step()``, keeps a small fingerprint of a spread sample of that
    optimizer's gradients. When a later ``backward()`` starts while those gradients are
    still there, non-zero and unchanged, and the same optimizer then steps again without
    any ``zero_grad()`` (of the optimizer, or of a module holding its parameters) in
    between, the step applied the accumulated sum of old and new gradients.

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
    ``zero_grad()``) is not reported: the gradients are cleared after each step.

    ## References
    - PyTorch docs, ``Optimizer.zero_grad``: https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html
    """

    code = "O101"
    name = "missing-zero-grad"
    severity = Severity.ERROR
    summary = "gradients accumulate across optimizer steps: no zero_grad between steps"
    fix = "call optimizer.zero_grad() once per step, before loss.backward()"

    def __init__(self, session) -> None:
        super().__init__(session)
        # Per optimizer (by id): the fingerprint taken at its last sampled step, and the
        # location of a backward() that ran on top of those gradients.
        self._snapshots: dict[int, list[tuple[weakref.ref, torch.Tensor, int]]] = {}
        self._stale_at: dict[int, tuple[Location | None, int]] = {}
        self._owners: dict[int, weakref.ref] = {}

    def on_step_start(self, event: StepStart) -> None:
        key = id(event.optimizer)
        stale = self._stale_at.pop(key, None)
        snaps = self._snapshots.pop(key, None)
        owner = self._owners.pop(key, None)
        if owner is None or owner() is not event.optimizer:
            # A new optimizer reusing a finished one's id (layer-wise phases): not its gradients.
            stale, snaps = None, None
        if stale is not None and snaps and self._still_same_tensors(snaps):
            location, step = stale
            self.report(
                f"Gradients from the previous {type(event.optimizer).__name__}.step() were still in "
                f".grad ({len(snaps)} sampled parameter tensors unchanged and non-zero) when backward() ran "
                "again, and nothing cleared them before this step: zero_grad() is missing, so gradients "
                "accumulate and every step applies their running sum.",
                location=location,
                evidence={"sampled_parameters_with_stale_grads": len(snaps), "step": step},
                step=step,
            )
        if not event.sampled or event.has_closure:
            return
        with_grads = [p for p in optimizer_params(event.optimizer) if p.grad is not None]
        fresh = []
        for p in spread_sample(with_grads):
            g = grad_slice(p)
            if g is not None:
                fresh.append((weakref.ref(p), g, id(p.grad)))
        if fresh:
            self._snapshots[key] = fresh
            self._owners[key] = weakref.ref(event.optimizer)

    @staticmethod
    def _unchanged(snaps) -> bool:
        for ref, old, _ in snaps:
            p = ref()
            if p is None:
                return False
            now = grad_slice(p)
            if now is None or not bool(old.any()) or not torch.equal(now, old):
                return False
        return True

    @staticmethod
    def _still_same_tensors(snaps) -> bool:
        """The .grad tensors are the very objects seen at the last step (not re-created after a
        manual ``p.grad = None``)."""
        for ref, _, grad_id in snaps:
            p = ref()
            if p is None or p.grad is None or id(p.grad) != grad_id:
                return False
        return True

    def on_backward(self, event: Backward) -> None:
        for key, snaps in self._snapshots.items():
            if key not in self._stale_at and self._unchanged(snaps):
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
            if any(ref() is not None and id(ref()) in owned for ref, _, _ in snaps):
                del self._stale_at[key]


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

    ## References
    - PyTorch docs, "Taking an optimization step": https://pytorch.org/docs/stable/optim.html
    """

    code = "O102"
    name = "zero-grad-before-step"
    severity = Severity.ERROR
    summary = "gradients cleared between backward() and step(): the step applies nothing"
    fix = "call zero_grad() before loss.backward(), not between backward() and step()"

    def on_step_start(self, event: StepStart) -> None:
        if event.has_closure or event.backwards_since_step == 0 or event.zero_grads_since_backward == 0:
            return
        if not event.sampled:
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
    Runs on every step, not only on sampled ones (testing ``p.grad is None`` reads no
    tensor data), so a bug that starts late in a run is seen when it starts.
    Closure-based optimizers (L-BFGS: ``optimizer.step(closure)``) compute their gradients
    inside ``step``: for them the closure's ``backward()`` counts, and the check looks at
    the end of the step whether the closure produced any gradient.

    ## References
    - PyTorch docs, ``torch.optim``: https://pytorch.org/docs/stable/optim.html
    - PyTorch docs, ``LBFGS.step(closure)``: https://pytorch.org/docs/stable/generated/torch.optim.LBFGS.html
    """

    code = "O103"
    name = "step-without-gradients"
    severity = Severity.WARNING
    summary = "optimizer.step() while none of its parameters has a gradient"
    fix = "call loss.backward() before optimizer.step(), on a loss computed from these parameters"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._backwards = 0  # backward() calls so far; a closure's run inside step()
        self._at_step_start: dict[int, int] = {}

    def on_backward(self, event: Backward) -> None:
        self._backwards += 1

    def on_step_start(self, event: StepStart) -> None:
        if event.has_closure:
            self._at_step_start[id(event.optimizer)] = self._backwards
            return
        if event.backwards_since_step and event.zero_grads_since_backward:
            return  # O102's case
        if has_any_grad(event.optimizer):
            return
        why = ("no backward() ran since the previous step" if event.backwards_since_step == 0
               else "the backward() did not reach them")
        self._report(event, why, event.backwards_since_step)

    def on_step_end(self, event: StepEnd) -> None:
        started = self._at_step_start.pop(id(event.optimizer), None)
        if not event.has_closure or started is None or has_any_grad(event.optimizer):
            return
        ran = self._backwards - started
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

    def on_loss(self, event: LossComputed) -> None:
        out = event.output
        if isinstance(out, torch.Tensor) and out.grad_fn is not None:
            self._last_loss = weakref.ref(out)
            self._last_reduction = event.options.get("reduction")

    def on_backward(self, event: Backward) -> None:
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

    def on_step_start(self, event: StepStart) -> None:
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
