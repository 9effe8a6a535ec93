"""Train/eval mode checks: M101 eval-in-train-mode, M102 train-in-eval-mode."""

from __future__ import annotations

import weakref

from nndoctor.checks._layers import ModeCache, mode_summary
from nndoctor.core.events import Forward
from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import model_forwards_only, sampled_training_forwards
from nndoctor.instrument.location import called_from_framework


@register
class EvalInTrainMode(Check):
    """
    ## What it does
    Flags forward passes of a model that is being trained (an optimizer updates its
    parameters) when they run without gradients (`torch.no_grad()` /
    `torch.inference_mode()`) — that is, evaluation — while the model's Dropout or
    BatchNorm layers are still in training mode.

    ## Why is this bad?
    In training mode Dropout zeroes random activations and BatchNorm normalises with the
    statistics of the current batch *and updates its running statistics*. Evaluating this
    way gives noisy, batch-size-dependent accuracy, and every validation batch silently
    shifts the BatchNorm running mean/variance toward the validation data. "Training normal,
    validation broken: check dropout and BatchNorm" is the classic symptom of a missing
    `model.eval()`.

    ## Example
    ```python
    for epoch in range(epochs):
        model.train()
        train_one_epoch(model, loader, optimizer)
        with torch.no_grad():
            for x, y in val_loader:          # model still in training mode
                val_loss += criterion(model(x), y)
    ```

    ## Use instead
    ```python
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                val_loss += criterion(model(x), y)
        model.train()
    ```

    A model whose parameters no optimizer updates (an EMA or mean-teacher copy) is not
    reported, and neither is a no-grad pass made by torch itself
    (`torch.optim.swa_utils.update_bn` deliberately runs BatchNorm in training mode).

    ## References
    - PyTorch docs, `nn.Module.eval`: https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval
    """

    code = "M101"
    name = "eval-in-train-mode"
    severity = Severity.ERROR
    summary = "evaluation forwards (no_grad) of a trained model whose Dropout/BatchNorm are in training mode"
    fix = "call model.eval() before evaluating (and model.train() before training again)"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._modes = ModeCache()

    @sampled_training_forwards
    @model_forwards_only
    def on_forward(self, event: Forward) -> None:
        if event.is_loss or (event.grad_enabled and not event.inference_mode):
            return
        module = event.module
        state = self.session.state
        training_layers, _ = self._modes.get(module, state.mode_generation, mode_summary)
        if not training_layers or not state.is_trained(module):
            return
        if called_from_framework(event.frame):
            return
        context = "torch.inference_mode()" if event.inference_mode else "torch.no_grad()"
        self.report(
            f"{type(module).__name__} is evaluated under {context} while {len(training_layers)} "
            f"Dropout/BatchNorm layer(s) are in training mode (e.g. {training_layers[0]}): "
            "model.eval() was not called, so results are noisy and BatchNorm running statistics "
            "drift toward the evaluation data.",
            location=event.location,
            evidence={"model": type(module).__name__, "layers_in_training_mode": list(training_layers),
                      "grad_enabled": event.grad_enabled, "inference_mode": event.inference_mode},
            step=event.step,
        )


@register
class TrainInEvalMode(Check):
    """
    ## What it does
    Flags a model that trained in training mode earlier in the run and is now trained
    (a forward with gradients, whose parameters an optimizer updates) while the model and
    its Dropout/BatchNorm layers are in eval mode — typically `model.train()` forgotten
    after a validation pass that called `model.eval()`.

    ## Why is this bad?
    After the first validation, every later epoch trains without Dropout and with frozen
    BatchNorm statistics. Training "works", but regularisation is gone and BatchNorm
    normalises with stale running statistics: the model converges to something else than
    the first epoch promised.

    ## Example
    ```python
    for epoch in range(epochs):
        for x, y in loader:            # model.train() only once, before the loop
            ...
        model.eval()
        evaluate(model, val_loader)    # the next epoch trains in eval mode
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        model.train()
        for x, y in loader:
            ...
        model.eval()
        evaluate(model, val_loader)
    ```

    Intentional patterns are not reported: a frozen backbone put in eval mode inside a
    model in training mode (`model.train(); model.backbone.eval()`), and a model that was
    never trained in training mode during the run (deliberate eval-mode fine-tuning).

    ## References
    - PyTorch docs, `nn.Module.train`: https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.train
    """

    code = "M102"
    name = "train-in-eval-mode"
    severity = Severity.ERROR
    summary = "training steps while the trained model's Dropout/BatchNorm are in eval mode (model.train() forgotten)"
    fix = "call model.train() at the start of every training epoch, after validation"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._modes = ModeCache()
        self._trained_in_train_mode: weakref.WeakSet = weakref.WeakSet()

    @sampled_training_forwards
    @model_forwards_only
    def on_forward(self, event: Forward) -> None:
        if event.is_loss or not event.grad_enabled or event.inference_mode:
            return
        module = event.module
        state = self.session.state
        if module.training:
            # Known once is enough: is_trained walks the optimizers' parameters.
            if module not in self._trained_in_train_mode and state.is_trained(module):
                self._trained_in_train_mode.add(module)
            return
        if module not in self._trained_in_train_mode:
            return
        _, eval_layers = self._modes.get(module, state.mode_generation, mode_summary)
        if not eval_layers:
            return
        self.report(
            f"{type(module).__name__} is being trained (forward with gradients) in eval mode: "
            f"{len(eval_layers)} Dropout/BatchNorm layer(s) are in eval mode (e.g. {eval_layers[0]}) "
            "although the same model trained in training mode earlier — model.train() is missing "
            "after evaluation.",
            location=event.location,
            evidence={"model": type(module).__name__, "layers_in_eval_mode": list(eval_layers)},
            step=event.step,
        )
