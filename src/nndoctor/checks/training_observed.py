"""Whether the run trained at all: R105 no-training-observed."""

from __future__ import annotations

from nndoctor.core.events import Backward, Forward, RunEnd
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import model_forwards_only


@register
class NoTrainingObserved(Check):
    """
    ## What it does
    At the end of a run that completed (or was stopped) without a single training step —
    no ``optimizer.step()`` of a torch optimizer and no update of a model's parameters by
    hand after ``backward()`` — says so, with what *was* seen (forwards with gradients,
    ``backward()`` calls), instead of an empty report.

    ## Why is this bad?
    "No problems found" after a run that never trained is misleading: every training
    check needs optimizer steps to look at. Either the script is not a training script
    (an evaluation or export script), the training branch never ran (a wrong flag, an
    empty DataLoader, ``epochs=0``), or the update is missing (``optimizer.step()``
    forgotten, so ``backward()`` computes gradients that nothing applies).

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()          # gradients computed ...
        optimizer.zero_grad()    # ... and thrown away: optimizer.step() is missing
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```
    Hand-written updates (``with torch.no_grad(): p -= lr * p.grad`` or
    ``p.data.add_(-lr * p.grad)``) count as steps.

    ## References
    - PyTorch tutorial, "Optimizing Model Parameters" (the training loop):
      https://pytorch.org/tutorials/beginner/basics/optimization_tutorial.html
    """

    code = "R105"
    name = "no-training-observed"
    severity = Severity.INFO
    summary = "the run ended without a single optimizer step or parameter update"
    fix = "make sure the training loop runs and calls optimizer.step() after loss.backward()"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._forwards = 0
        self._backwards = 0
        self._where: Location | None = None

    @model_forwards_only
    def on_forward(self, event: Forward) -> None:
        if event.is_loss or not event.grad_enabled:
            return
        if self.session.state.total_steps:
            self._trained()
            return
        self._forwards += 1
        if self._where is None and self._backwards == 0:
            self._where = event.location

    def on_backward(self, event: Backward) -> None:
        if self.session.state.total_steps:
            self._trained()
            return
        self._backwards += 1
        if self._backwards == 1:
            self._where = event.location or self._where

    def _trained(self) -> None:
        """An update ran (the count only grows): forwards and backwards have nothing left to
        tell, and stop costing a call on every step."""
        self.session.unsubscribe(self, "forward", "backward")

    def on_run_end(self, event: RunEnd) -> None:
        if event.status not in ("completed", "stopped") or self.session.state.total_steps:
            return
        if self._backwards:
            seen = (f"backward() ran {self._backwards} time(s) but no optimizer.step() and no update "
                    "of the parameters followed, so the gradients were never applied")
        elif self._forwards:
            seen = (f"models ran {self._forwards} forward pass(es) with gradients enabled, but no "
                    "backward() and no optimizer.step()")
        else:
            seen = "no model forward with gradients, no backward() and no optimizer.step()"
        self.report(
            f"nndoctor observed no training in this run: {seen}. The training checks had nothing to look at.",
            location=self._where,
            evidence={"optimizer_steps": 0, "forwards_with_grad": self._forwards,
                      "backward_calls": self._backwards},
            step=event.step,
        )
