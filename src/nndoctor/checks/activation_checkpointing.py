"""Activation checkpointing: M111 reentrant checkpoint whose inputs need no gradient."""

from __future__ import annotations

from nndoctor.core.events import ActivationCheckpoint
from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register


@register
class CheckpointedParamsWithoutGrad(Check):
    """
    ## What it does
    Watches ``torch.utils.checkpoint.checkpoint``. It reports a call that uses the
    **reentrant** implementation (``use_reentrant=True``, or the argument left out, which
    means True), with gradients enabled, where **no tensor input requires grad** while the
    checkpointed module holds trainable parameters. The finding names the callable, its
    number of trainable parameter tensors and the call's line.

    ## Why is this bad?
    The reentrant checkpoint is an ``autograd.Function`` that runs the block under
    ``no_grad`` and rebuilds the graph during backward. Its output requires grad only if one
    of its *inputs* does: when the block is the first one (its input is the data batch) or
    its input comes from frozen layers, the output has no ``grad_fn``, backward never enters
    the block, and its parameters get **no gradient at all** — they silently stay at their
    initial values (torch only warns "None of the inputs have requires_grad=True"). The
    non-reentrant implementation records the block's parameters and has no such limit;
    PyTorch recommends it and will require the argument to be passed explicitly.

    ## Example
    ```python
    def forward(self, x):                      # x: the input batch
        x = checkpoint(self.block1, x, use_reentrant=True)
        return self.head(x)
    ```

    ## Use instead
    ```python
        x = checkpoint(self.block1, x, use_reentrant=False)
    ```
    (or make an input require grad, the old workaround). No threshold: the condition is
    exact.

    ## References
    - PyTorch docs, ``torch.utils.checkpoint`` (reentrant variant: "at least one input needs requires_grad=True"): https://pytorch.org/docs/stable/checkpoint.html
    - PyTorch issue #48439, parameters inside a checkpoint get no gradient when inputs do not require grad: https://github.com/pytorch/pytorch/issues/48439
    """

    code = "M111"
    name = "checkpointed-params-without-grad"
    severity = Severity.ERROR
    summary = "reentrant activation checkpointing whose inputs need no grad: the block's parameters get none"
    fix = "pass use_reentrant=False to torch.utils.checkpoint.checkpoint"

    def on_activation_checkpoint(self, event: ActivationCheckpoint) -> None:
        if event.inputs_require_grad or not event.grad_enabled or event.trainable_parameters <= 0:
            return
        how = "use_reentrant=True" if event.use_reentrant else "use_reentrant not passed (defaults to True)"
        self.report(
            f"checkpoint({event.function_name}, …) uses the reentrant implementation ({how}) and none of its "
            f"inputs requires grad, so its output has no autograd graph: the {event.trainable_parameters} "
            f"trainable parameter tensor(s) inside {event.function_name} receive no gradient and never train.",
            location=event.location,
            evidence={"function": event.function_name, "use_reentrant": event.use_reentrant,
                      "inputs_require_grad": False, "trainable_parameter_tensors": event.trainable_parameters},
            step=event.step,
        )
