"""X106 loss-sum-across-devices: per-device losses summed where they should be averaged.

Two shapes of the same mistake, both read from the backward's own autograd graph:

- ``nn.DataParallel`` around a model that returns its loss: every GPU returns a 0-dim loss,
  ``gather`` stacks them into a vector of one loss per device, and ``.sum()`` on that
  vector before ``backward`` makes the gradient the sum over devices — N times the
  gradient of the mean, so the learning rate silently scales with the number of GPUs.
- Under DDP, the loss ``all_reduce``-d with ``SUM`` and then back-propagated without a
  division by the world size.
"""

from __future__ import annotations

from typing import Any

from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.instrument.loss_sum import GATHERED_KEY, facts, pending_for

# Nodes that only multiply or divide the value on the path by a constant (or copy it).
_SCALE_NODES = {"MulBackward0", "DivBackward0"}
_COPY_NODES = {"ToCopyBackward0", "CloneBackward0", "ViewBackward0", "SqueezeBackward0",
               "SqueezeBackward1", "UnsqueezeBackward0", "ReshapeAliasBackward0"}
_MAX_CHAIN = 8


def _constant(value: Any) -> float | None:
    """A saved operand as a Python number, if it is a one-element tensor or a number."""
    if isinstance(value, (int, float)):
        return float(value)
    numel = getattr(value, "numel", None)
    if numel is not None and numel() == 1 and not getattr(value, "requires_grad", False):
        return float(value.detach().reshape(()).item())
    return None


def summed_device_losses(root: Any, scaler_scale: float | None = None) -> dict[str, Any] | None:
    """Follow the backward root's graph down a chain of constant scalings and copies; if it
    reaches ``SumBackward0`` over a gathered per-device loss vector, return the vector's
    annotation and the product of the constants met after the sum (the GradScaler's scale,
    when ``scaler_scale`` is given and one constant equals it, counts as 1)."""
    node = root
    multiplier = 1.0
    scaler_seen = False
    for _ in range(_MAX_CHAIN):
        if node is None:
            return None
        name = type(node).__name__
        nexts = [fn for fn, _ in node.next_functions]
        if name == "SumBackward0":
            child = nexts[0] if nexts else None
            annotation = child.metadata.get(GATHERED_KEY) if child is not None else None
            if annotation is None:
                return None
            return {**annotation, "multiplier": multiplier, "scaler_removed": scaler_seen}
        if name in _COPY_NODES and len(nexts) == 1:
            node = nexts[0]
            continue
        if name in _SCALE_NODES and len(nexts) == 2:
            live = [i for i, fn in enumerate(nexts) if fn is not None]
            if len(live) != 1 or (name == "DivBackward0" and live[0] != 0):
                return None  # both sides carry gradients, or the loss is the divisor
            other = getattr(node, "_saved_other" if live[0] == 0 else "_saved_self", None)
            value = _constant(other)
            if value is None or value == 0:
                return None
            if name == "MulBackward0" and scaler_scale is not None and not scaler_seen and value == scaler_scale:
                scaler_seen = True
            else:
                multiplier = multiplier * value if name == "MulBackward0" else multiplier / value
            node = nexts[live[0]]
            continue
        return None
    return None


def _scaler_scale(session: Any) -> float | None:
    ref = getattr(session.state, "scaler", None)
    scaler = ref() if ref is not None else None
    if scaler is None or not scaler.is_enabled() or getattr(scaler, "_scale", None) is None:
        return None
    return float(scaler.get_scale())


@register
class LossSumAcrossDevices(Check):
    """
    ## What it does
    On each backward, looks at the loss's autograd graph. With `nn.DataParallel` around a
    model that returns its own loss, every GPU returns a 0-dim loss and `DataParallel`
    gathers them into a vector with one entry per device; the check reports a backward
    whose graph sums that vector (`.sum()`, possibly followed by constant scalings) without
    dividing by the number of devices. Under DDP it reports a backward on a loss that was
    `all_reduce`d with `SUM` across the ranks (in place with `torch.distributed.all_reduce`,
    or through the differentiable `torch.distributed.nn.functional.all_reduce`) and not
    divided by the world size.

    ## Why is this bad?
    The gradient of a sum over N devices is N times the gradient of their mean: the
    effective learning rate grows with the number of GPUs, so a recipe tuned on one GPU
    diverges or behaves differently on four, and the logged loss is N times too large.
    With `torch.distributed.all_reduce` the gradient itself stays local (PyTorch warns that
    it cannot differentiate through it) but the loss the rank reports is the sum; with the
    differentiable `all_reduce` the gradients are summed as well, on top of DDP's own
    averaging.

    ## Example
    ```python
    model = nn.DataParallel(model_that_returns_loss)
    loss = model(x, y).sum()          # one loss per GPU, summed
    loss.backward()
    ```

    ## Use instead
    ```python
    loss = model(x, y).mean()         # average the per-device losses
    loss.backward()
    # DDP: backward on the local loss; for logging, all_reduce a detached copy and divide
    reduced = loss.detach().clone(); dist.all_reduce(reduced); reduced /= dist.get_world_size()
    ```

    ## References
    - Hugging Face Transformers Trainer (`loss = loss.mean()  # mean() to average on multi-gpu parallel training`): https://github.com/huggingface/transformers/blob/main/src/transformers/trainer.py
    - PyTorch docs, DataParallel (outputs gathered on the output device; scalars become a vector): https://pytorch.org/docs/stable/generated/torch.nn.DataParallel.html
    - PyTorch docs, torch.distributed.all_reduce (`ReduceOp.SUM` is the default): https://pytorch.org/docs/stable/distributed.html#torch.distributed.all_reduce
    """

    code = "X106"
    name = "loss-sum-across-devices"
    severity = Severity.ERROR
    summary = "per-device losses summed instead of averaged"
    fix = ("average the per-device losses: loss.mean() on DataParallel's output; under DDP back-propagate the "
           "local loss and divide an all-reduced copy by dist.get_world_size() for logging")

    # A backward needs a look only once a loss was gathered from several devices or summed
    # across ranks: the instrumentation's facts arm the handler (``LossSumFacts.changed``).
    idle_handlers = ("backward",)

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._reported_dp = False
        self._facts: Any = None  # the session's loss-sum facts, looked up once (every backward asks)
        facts(session).listeners.append(lambda: session.arm(self, "backward"))

    def on_backward(self, event: Any) -> None:
        tensor = event.tensor
        if tensor is None or getattr(tensor, "grad_fn", None) is None:
            return
        state = self._facts
        if state is None:
            state = self._facts = facts(self.session)
        if state.summed:
            record = pending_for(state, tensor)
            if record is not None:
                record.reported = True
                self._report_all_reduce(record, event)
                return
        if not self._reported_dp and state.gathered:
            found = summed_device_losses(tensor.grad_fn, _scaler_scale(self.session))
            if found is not None and abs(found["devices"] * found["multiplier"] - 1.0) > 1e-6:
                self._reported_dp = True
                self._report_dataparallel(found, event)

    def _report_dataparallel(self, found: dict[str, Any], event: Any) -> None:
        devices, multiplier = found["devices"], found["multiplier"]
        where = (Location(found["path"], found["line"]) if found.get("path") else None)
        after = "" if multiplier == 1.0 else f", then scaled by {multiplier:g}"
        self.report(
            f"DataParallel gathered one loss per GPU into a vector of shape {found['shape']} "
            f"(called at {where or 'an unknown line'}), and the loss given to backward is its .sum(){after}: "
            f"the gradient is {devices}× the gradient of the mean over the {devices} devices, so the effective "
            f"learning rate is {devices}× the one set and changes with the number of GPUs.",
            location=event.location,
            evidence={"devices": devices, "gathered_shape": found["shape"], "reduction": "sum",
                      "multiplier_after_sum": multiplier, "effective_factor": devices * multiplier,
                      "factor_vs_mean": devices, "scaler_scale_removed": found["scaler_removed"],
                      "dataparallel_call": str(where) if where else None},
            step=event.step,
        )

    def _report_all_reduce(self, record: Any, event: Any) -> None:
        world = record.world_size
        if record.differentiable:
            effect = (f"the differentiable all_reduce sums the gradients too, so on top of DDP's averaging every "
                      f"gradient is {world}× larger: the effective learning rate scales with the world size")
        else:
            effect = ("torch.distributed.all_reduce is not differentiable, so the gradient stays this rank's own "
                      f"(PyTorch warns about it), but the loss value used and logged is {world}× the mean")
        self.report(
            f"The loss passed to backward was all_reduced with SUM over {world} ranks and not divided by the "
            f"world size: {record.local:.6g} on this rank became {record.reduced:.6g} "
            f"(the mean would be {record.reduced / world:.6g}); {effect}.",
            location=record.location or event.location,
            evidence={"world_size": world, "local_loss": record.local, "summed_loss": record.reduced,
                      "mean_loss": record.reduced / world, "effective_factor": world,
                      "differentiable_all_reduce": record.differentiable,
                      "backward_at": str(event.location) if event.location else None},
            step=record.step,
        )
