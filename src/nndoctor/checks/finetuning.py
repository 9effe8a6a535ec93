"""Fine-tuning a frozen part of a model: B104 frozen BatchNorm whose running statistics drift."""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from nndoctor.core.events import ModeChange, ModuleOutput
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register


def batchnorm_is_frozen(bn: _BatchNorm, trained_ids: dict[int, Any]) -> bool:
    """An affine BatchNorm none of whose parameters is trained (no grad, or in no optimizer)."""
    params = [p for p in (bn.weight, bn.bias) if p is not None]
    if not params:
        return False
    return all(not p.requires_grad or id(p) not in trained_ids for p in params)


def running_stats_drift(mean0: torch.Tensor, var0: torch.Tensor, mean1: torch.Tensor,
                        var1: torch.Tensor) -> tuple[float, float]:
    """(largest shift of a running mean in units of its original std, largest relative
    change of a running variance)."""
    std0 = var0.clamp_min(1e-12).sqrt()
    mean_shift = ((mean1 - mean0).abs() / std0).max().item()
    var_change = ((var1 - var0).abs() / var0.clamp_min(1e-12)).max().item()
    return float(mean_shift), float(var_change)


def affine_copy(bn: _BatchNorm) -> list[torch.Tensor]:
    """A copy of the layer's affine parameters, to tell a frozen layer from one whose
    parameters something other than an optimizer overwrites (an EMA teacher)."""
    return [p.detach().clone() for p in (bn.weight, bn.bias) if p is not None]


def affine_changed(bn: _BatchNorm, copy: list[torch.Tensor]) -> bool:
    """Did the affine parameters change since ``copy`` (any value, however small)?"""
    current = [p.detach() for p in (bn.weight, bn.bias) if p is not None]
    if len(current) != len(copy):
        return True
    return any(now.shape != then.shape or not torch.equal(now, then) for now, then in zip(current, copy))


@dataclass
class _Snapshot:
    name: str
    mean: torch.Tensor
    var: torch.Tensor
    affine: list[torch.Tensor]
    step: int
    location: Location | None
    sightings: int = 1


@register
class FrozenBatchNormDrifting(Check):
    """
    ## What it does
    On sampled steps, looks at every BatchNorm layer that runs in **training mode** while an
    optimizer is training something, and whose affine parameters are **frozen**: no
    optimizer trains them (``requires_grad=False``, or in no optimizer) *and* they do not
    change. It copies the layer's running mean and variance, and its weight and bias, the
    first time it sees it; when the layer has been seen in training mode on 3 sampled steps,
    across at least one optimizer step, its weight and bias are unchanged and its running
    statistics moved, it reports the drift: the largest shift of a running mean (in standard deviations of the
    original statistics) and the largest relative change of a running variance. The location
    is the ``train()`` call that put the layer in training mode (or the forward call).

    ## Why is this bad?
    ``requires_grad_(False)`` freezes the weights, not the BatchNorm statistics: in training
    mode every forward still overwrites ``running_mean``/``running_var`` with the statistics
    of the new data (``momentum=0.1``: 10% per batch). The pretrained backbone the user
    believes frozen changes under them — its normalisation now follows the fine-tuning
    batches, often small and from another distribution — and evaluation, which uses those
    running statistics, degrades while the "frozen" weights are unchanged. A
    ``model.train()`` at the start of each epoch undoes an earlier ``backbone.eval()``.

    ## Example
    ```python
    model.backbone.requires_grad_(False)
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.01)
    for epoch in range(epochs):
        model.train()                      # the frozen backbone's BatchNorm too
        for x, y in loader:
            loss = criterion(model(x), y)
    ```

    ## Use instead
    ```python
        model.train()
        model.backbone.eval()              # frozen part: fixed statistics (and no dropout)
    ```
    or override ``train()`` in the model to keep frozen BatchNorm layers in eval mode, or
    replace them with ``torchvision.ops.FrozenBatchNorm2d``. When updating the statistics on
    the new data is intended (domain adaptation), ignore this check. A layer whose weight or
    bias changes outside the optimizer — the teacher of a mean-teacher / EMA setup, which
    copies an average of the student after every step and may run in training mode on
    purpose — is not frozen and is not reported. There is no numeric
    threshold beyond "the statistics moved" (a relative change above 1e-6): any drift of a
    layer believed frozen is unintended.

    ## References
    - PyTorch docs, ``BatchNorm2d`` (running statistics are updated in training mode, whatever ``requires_grad``): https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm2d.html
    - torchvision ``FrozenBatchNorm2d``: https://pytorch.org/vision/stable/generated/torchvision.ops.FrozenBatchNorm2d.html
    - PyTorch forum, "How to freeze BN layers while training the rest of network": https://discuss.pytorch.org/t/how-to-freeze-bn-layers-while-training-the-rest-of-network-mean-and-var-wont-freeze/89736
    """

    code = "B104"
    name = "frozen-batchnorm-drifting"
    severity = Severity.WARNING
    summary = ("BatchNorm with frozen affine parameters still updating running statistics in train mode "
               "(fine-tuning)")
    fix = "put the frozen part in eval mode after every model.train() (backbone.eval()), or use FrozenBatchNorm2d"
    MIN_SIGHTINGS = 3
    TOLERANCE = 1e-6
    MAX_LAYERS = 64

    def __init__(self, session) -> None:
        super().__init__(session)
        self._snapshots: weakref.WeakKeyDictionary[Any, _Snapshot] = weakref.WeakKeyDictionary()
        self._not_frozen: weakref.WeakSet[Any] = weakref.WeakSet()
        self._train_calls: list[tuple[weakref.ref, Location | None]] = []
        self._reported = False

    def on_mode_change(self, event: ModeChange) -> None:
        if event.training and not self._reported:
            self._train_calls.append((weakref.ref(event.module), event.location))
            del self._train_calls[:-8]

    def on_module_output(self, event: ModuleOutput) -> None:
        bn = event.module
        if (self._reported or not isinstance(bn, _BatchNorm) or not bn.training
                or not bn.track_running_stats or bn.running_mean is None or bn.running_var is None):
            return
        if bn in self._not_frozen:
            return
        trained = self.session.state.optimizer_param_ids()
        if not trained or not batchnorm_is_frozen(bn, trained):
            return
        snapshot = self._snapshots.get(bn)
        if snapshot is None:
            if len(self._snapshots) < self.MAX_LAYERS:
                name = f"{type(event.root).__name__}.{event.qualname}"
                self._snapshots[bn] = _Snapshot(name, bn.running_mean.detach().clone(),
                                                bn.running_var.detach().clone(), affine_copy(bn), event.step,
                                                event.location)
            return
        if event.step != snapshot.step:
            snapshot.sightings += 1
        if snapshot.sightings < self.MIN_SIGHTINGS or self.session.step <= snapshot.step:
            return
        if affine_changed(bn, snapshot.affine):
            # Not frozen: its parameters are written outside any optimizer (an EMA / mean teacher
            # copies the student into it after each step), and its statistics follow by design.
            self._not_frozen.add(bn)
            del self._snapshots[bn]
            return
        mean_shift, var_change = running_stats_drift(snapshot.mean, snapshot.var,
                                                     bn.running_mean.detach(), bn.running_var.detach())
        if not (math.isfinite(mean_shift) and math.isfinite(var_change)):
            return
        if max(mean_shift, var_change) <= self.TOLERANCE:
            return
        self._reported = True
        others = sum(1 for layer, _ in self._snapshots.items() if layer is not bn)
        location = self._train_location(bn) or snapshot.location
        self.report(
            f"{snapshot.name} ({type(bn).__name__}) has frozen parameters (not trained) but runs in training "
            f"mode, so its running statistics keep changing: from step {snapshot.step} to step {event.step} "
            f"a running mean moved by up to {mean_shift:.3g} of its original standard deviation and a running "
            f"variance changed by up to {var_change:.1%}"
            f"{f' ({others} more frozen BatchNorm layer(s) in training mode)' if others else ''}. "
            "Evaluation will use statistics of the fine-tuning batches, not the pretrained ones.",
            location=location,
            evidence={"layer": snapshot.name, "from_step": snapshot.step, "to_step": event.step,
                      "max_mean_shift_in_std": round(mean_shift, 6), "max_var_change": round(var_change, 6),
                      "other_frozen_bn_in_train_mode": others},
            step=event.step,
        )
        self._snapshots = weakref.WeakKeyDictionary()

    def _train_location(self, bn: _BatchNorm) -> Location | None:
        """The latest ``train()`` call on a module containing ``bn``."""
        for ref, location in reversed(self._train_calls):
            module = ref()
            if module is not None and any(m is bn for m in itertools.islice(module.modules(), 10000)):
                return location
        return None
