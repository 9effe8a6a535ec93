"""Memory leaks through autograd graphs: P108 retained-loss-graph."""

from __future__ import annotations

import weakref

import torch

from nndoctor.events import LossComputed, StepEnd
from nndoctor.findings import Severity
from nndoctor.registry import Check, register


@register
class RetainedLossGraph(Check):
    """
    ## What it does
    Keeps a weak reference to every loss tensor that carries an autograd graph. At each
    optimizer step it counts the losses from more than ``2`` steps ago that are still
    alive: something in the user's code holds on to them.

    ## Why is this bad?
    ``losses.append(loss)`` (instead of ``loss.item()``) keeps every step's tensor — and
    with it the autograd graph and, until backward frees them, the saved activations —
    alive for the whole run. Memory grows every step until an out-of-memory error that
    seems to come from nowhere (seed 002).

    ## Example
    ```python
    losses = []
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        losses.append(loss)
    ```

    ## Use instead
    ```python
        losses.append(loss.item())        # or loss.detach()
    ```
    The threshold — at least ``3`` losses older than two steps still alive — leaves room
    for the ordinary ``loss`` variable of the current and previous iteration. Not
    detected: ``running_loss += loss`` (the running sum keeps the graphs but the loss
    tensors themselves die; autograd nodes cannot be weakly referenced).

    ## References
    - PyTorch FAQ, "My model reports cuda runtime error(2): out of memory" (accumulating history): https://pytorch.org/docs/stable/notes/faq.html
    - shared/seeds 002.
    """

    code = "P108"
    name = "retained-loss-graph"
    severity = Severity.WARNING
    summary = "loss tensors with their graphs kept alive across steps (losses.append(loss))"
    fix = "store loss.item() (or loss.detach()) instead of the loss tensor"
    AGE = 2
    MIN_ALIVE = 3

    def __init__(self, session) -> None:
        super().__init__(session)
        self._losses: list[tuple[int, weakref.ref, object]] = []
        self._reported = False

    def on_loss(self, event: LossComputed) -> None:
        out = event.output
        if self._reported or not isinstance(out, torch.Tensor) or out.grad_fn is None:
            return
        if len(self._losses) < 512:
            self._losses.append((event.step, weakref.ref(out), event.location))

    def on_step_end(self, event: StepEnd) -> None:
        if self._reported or not self._losses:
            return
        cutoff = event.step - self.AGE
        alive = [(s, loc) for s, ref, loc in self._losses if s < cutoff and ref() is not None]
        # Forget the dead, so the list stays short on a correct program.
        self._losses = [entry for entry in self._losses if entry[1]() is not None]
        if len(alive) >= self.MIN_ALIVE:
            self._reported = True
            self._losses = []
            self.report(
                f"{len(alive)} loss tensors from earlier steps (the oldest from step {alive[0][0]}) are still "
                "alive with their autograd graphs: the code keeps references to them "
                "(e.g. losses.append(loss)), so memory grows every step.",
                location=alive[0][1],
                evidence={"alive_old_losses": len(alive), "oldest_step": alive[0][0], "step": event.step},
                step=event.step,
            )
