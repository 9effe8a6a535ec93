"""Model structure advice: M108 bias before BatchNorm, N106 dead convolution filters (info)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

from nndoctor.core.events import ModuleOutput, StepEnd
from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import sampled_only
from nndoctor.instrument.numerics_probe import construction_site
from nndoctor.instrument.stats import first_tensor


@register
class BiasBeforeBatchNorm(Check):
    """
    ## What it does
    On the first sampled steps, follows the outputs of the model's layers: when a
    ``Conv*d`` or ``Linear`` layer with a trainable bias hands its output tensor *directly*
    to a BatchNorm layer in training mode, it reports the pair (once per pair), at the line
    that built the convolution.

    ## Why is this bad?
    In training mode BatchNorm subtracts the per-channel batch mean, which removes any
    per-channel constant — the bias of the layer before it is cancelled exactly. The bias
    still costs memory, an optimizer state and an update per step, and with weight decay
    it is pulled toward 0 for nothing; BatchNorm's own ``beta`` already provides the shift.
    This is advice (info), not an error: the results are the same.

    ## Example
    ```python
    nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())
    ```

    ## Use instead
    ```python
    nn.Sequential(nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
    ```
    (torchvision's ResNets build every convolution before a BatchNorm with ``bias=False``.)
    No threshold: the pattern is exact.

    ## References
    - Ioffe & Szegedy, "Batch Normalization" (2015), §3.2 (the bias "can be ignored since its effect will be canceled by the subsequent mean subtraction"): https://arxiv.org/abs/1502.03167
    - PyTorch Performance Tuning Guide, "Disable bias for convolutions directly followed by a batch norm": https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    """

    code = "M108"
    name = "bias-before-batchnorm"
    severity = Severity.INFO
    summary = "Conv/Linear bias immediately followed by BatchNorm (redundant) — info"
    fix = "build the layer with bias=False: BatchNorm's beta already provides the shift"
    needs = frozenset({"construction_sites"})
    MAX_STEPS = 2

    def __init__(self, session) -> None:
        super().__init__(session)
        self._last: tuple[weakref.ref, weakref.ref, str] | None = None  # (layer, its output, name)
        self._reported: set[str] = set()

    def on_module_output(self, event: ModuleOutput) -> None:
        if event.step >= self.MAX_STEPS:
            return
        module = event.module
        if isinstance(module, (_ConvNd, nn.Linear)):
            out = event.output
            bias = getattr(module, "bias", None)
            if isinstance(out, torch.Tensor) and isinstance(bias, torch.Tensor) and bias.requires_grad:
                self._last = (weakref.ref(module), weakref.ref(out), f"{type(event.root).__name__}.{event.qualname}")
            else:
                self._last = None
            return
        if not isinstance(module, _BatchNorm) or not module.training or self._last is None:
            return
        layer_ref, out_ref, layer_name = self._last
        self._last = None
        produced = out_ref()
        layer = layer_ref()
        if produced is None or layer is None or first_tensor(event.inputs) is not produced:
            return
        bn_name = f"{type(event.root).__name__}.{event.qualname}"
        if layer_name in self._reported:
            return
        self._reported.add(layer_name)
        self.report(
            f"{layer_name} ({type(layer).__name__}) has a bias and feeds {bn_name} ({type(module).__name__}) "
            f"directly: BatchNorm subtracts the batch mean per channel, which cancels the "
            f"{layer.bias.numel()} bias values exactly.",
            location=construction_site(self.session, layer) or construction_site(self.session, module)
            or event.location,
            evidence={"layer": layer_name, "batchnorm": bn_name, "bias_values": layer.bias.numel()},
            step=event.step,
        )


def dead_filter_indices(weight: torch.Tensor, ratio: float = 1e-3) -> tuple[list[int], float]:
    """Output filters whose kernel norm is below ``ratio`` × the layer's largest, and that
    largest norm."""
    with torch.no_grad():
        norms = weight.detach().reshape(weight.shape[0], -1).float().norm(dim=1).cpu()
    largest = float(norms.max()) if norms.numel() else 0.0
    if largest <= 0:
        return [], largest
    return [i for i, n in enumerate(norms.tolist()) if n < ratio * largest], largest


@register
class DeadFilters(Check):
    """
    ## What it does
    From step 8, at sampled optimizer steps, computes the L2 norm of every output filter of
    the trained models' convolutions (one reduction per layer) and reports, once per layer,
    the filters whose norm is below **1e-3 of the layer's largest**.

    ## Why is this bad?
    A filter with (almost) zero weights produces a constant; after a ReLU, a zero output
    gets a zero gradient and the filter never recovers. Such filters come from pruning,
    from a checkpoint loaded into the wrong layer, from strong weight decay on inactive
    units, or from a learning-rate spike. They waste compute and capacity; many of them in
    one layer mean the layer is much narrower than designed. This is advice (info).

    ## Example
    ```python
    conv.weight.data[:8] = 0        # a pruned checkpoint, or dead units after an lr spike
    ```

    ## Use instead
    Re-initialise the dead filters (or remove them and shrink the layer), lower the
    learning rate or weight decay if they died in training, and check checkpoint loading
    if they were loaded. Threshold: 1e-3 of the largest filter norm of the same layer —
    scale-free, so it does not depend on the initialisation.

    ## References
    - Li et al., "Pruning Filters for Efficient ConvNets" (2017), filter L1/L2 norms as importance: https://arxiv.org/abs/1608.08710
    - Lu et al., "Dying ReLU and Initialization" (2019): https://arxiv.org/abs/1903.06733
    """

    code = "N106"
    name = "dead-filters"
    severity = Severity.INFO
    summary = "conv filters whose kernel norm is < 1e-3 of the layer's largest (dead or prunable) — info"
    fix = "re-initialise or remove the dead filters; lower the learning rate/weight decay if they died in training"
    needs = frozenset({"construction_sites"})
    FROM_STEP = 8
    RATIO = 1e-3

    def __init__(self, session) -> None:
        super().__init__(session)
        self._checked: weakref.WeakSet[Any] = weakref.WeakSet()

    @sampled_only
    def on_step_end(self, event: StepEnd) -> None:
        if not event.sampled or event.step < self.FROM_STEP:
            return
        for root in self.session.state.trained_roots():
            for name, layer in root.named_modules():
                if not isinstance(layer, _ConvNd) or layer in self._checked or layer.weight.shape[0] < 2:
                    continue
                self._checked.add(layer)
                dead, largest = dead_filter_indices(layer.weight, self.RATIO)
                if not dead:
                    continue
                qualname = f"{type(root).__name__}.{name}"
                total = layer.weight.shape[0]
                self.report(
                    f"{qualname} ({type(layer).__name__}) has {len(dead)} of {total} filters with a kernel norm "
                    f"below {self.RATIO:g} × the layer's largest ({largest:.3g}) at step {event.step}: "
                    f"filters {dead[:10]}{' …' if len(dead) > 10 else ''} are dead or prunable.",
                    location=construction_site(self.session, layer) or event.location,
                    evidence={"layer": qualname, "dead_filters": len(dead), "filters": total,
                              "indices": dead[:32], "largest_norm": largest, "ratio": self.RATIO},
                    step=event.step,
                )
