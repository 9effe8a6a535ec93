"""BatchNorm configuration and behaviour: B101 momentum convention, B102 tiny batches,
B103 running statistics that never change."""

from __future__ import annotations

import statistics
import weakref
from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from nndoctor.core.events import ModuleOutput, StepStart
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import sampled_only
from nndoctor.instrument.numerics_probe import construction_site
from nndoctor.instrument.stats import first_plain_tensor


def momentum_verdict(momentum: float | None) -> Severity | None:
    """Severity of a BatchNorm momentum that reads like a TF/Keras decay (None: fine)."""
    if momentum is None:  # cumulative moving average: a deliberate PyTorch option
        return None
    if momentum >= 0.9:
        return Severity.ERROR
    if momentum >= 0.5:
        return Severity.WARNING
    return None


def trained_batchnorms(session: Any) -> list[tuple[str, _BatchNorm]]:
    """(qualified name, layer) of every BatchNorm inside the models being trained."""
    found = []
    for root in session.state.trained_roots():
        for name, module in root.named_modules():
            if isinstance(module, _BatchNorm):
                found.append((f"{type(root).__name__}.{name}" if name else type(root).__name__, module))
    return found


@register
class BatchNormMomentumConvention(Check):
    """
    ## What it does
    At sampled optimizer steps (the first one included), looks at every BatchNorm layer of
    the trained models not seen before and
    flags ``momentum ≥ 0.5`` (an error from 0.9, the TF/Keras decay values 0.9/0.99/0.999).

    ## Why is this bad?
    The two frameworks define the number the other way round:

    - TensorFlow/Keras: ``moving = moving * decay + batch * (1 - decay)``, default
      ``decay``/``momentum`` 0.99 (tf.layers, Keras) or 0.999 (tf.contrib, slim).
    - PyTorch: ``running = running * (1 - momentum) + batch * momentum``, default
      ``momentum=0.1`` — which keeps 0.9 of the old value, the same as a TF decay of 0.9.

    A TF decay of 0.99 copied as PyTorch ``momentum=0.99`` keeps only 1% of the running
    statistics at each step: they become the statistics of the last batch. Training looks
    fine (batch statistics are used); validation and test, which use the running
    statistics, are noisy and much worse ("loss jumps at val/test").

    ## Example
    ```python
    bn = nn.BatchNorm2d(64, momentum=0.99)      # ported from Keras BatchNormalization(momentum=0.99)
    ```

    ## Use instead
    ```python
    bn = nn.BatchNorm2d(64, momentum=0.01)      # PyTorch momentum = 1 - TF decay
    ```

    ## References
    - PyTorch docs, ``BatchNorm2d`` (the momentum note): https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm2d.html
    - Keras docs, ``BatchNormalization``: https://keras.io/api/layers/normalization_layers/batch_normalization/
    """

    code = "B101"
    name = "batchnorm-momentum-convention"
    severity = Severity.ERROR
    summary = "BatchNorm momentum ≥ 0.5: a TF/Keras decay (0.9/0.99) ported as PyTorch momentum"
    fix = "use momentum = 1 - decay (a Keras momentum of 0.99 is PyTorch momentum=0.01); PyTorch's default is 0.1"
    needs = frozenset({"construction_sites"})

    def __init__(self, session) -> None:
        super().__init__(session)
        self._seen: weakref.WeakSet = weakref.WeakSet()

    @sampled_only
    def on_step_start(self, event: StepStart) -> None:
        if not event.sampled:
            return  # walking the model's modules every step would cost on small models
        for name, bn in trained_batchnorms(self.session):
            if bn in self._seen:
                continue
            self._seen.add(bn)
            momentum = bn.momentum
            severity = momentum_verdict(momentum)
            if severity is None or momentum is None or not bn.track_running_stats:
                continue
            m = float(momentum)
            self.report(
                f"{name} ({type(bn).__name__}) has momentum={m:g}: in PyTorch that keeps only "
                f"{1 - m:.0%} of the running statistics per step (TF/Keras decay {m:g} is PyTorch "
                f"momentum={1 - m:.3g}), so evaluation uses the statistics of the last few batches.",
                location=construction_site(self.session, bn) or event.location,
                evidence={"layer": name, "momentum": m, "keeps_per_step": round(1 - m, 6),
                          "pytorch_equivalent": round(1 - m, 6)},
                severity=severity, step=event.step,
            )


@register
class BatchNormTinyBatch(Check):
    """
    ## What it does
    On sampled forwards, records the batch size seen by every BatchNorm layer in training
    mode (gradients enabled). When the median over at least 3 such forwards is **below 8**
    it reports the layer. A single small last batch of an epoch does not fire (median).
    Layers in eval mode (a frozen pretrained backbone) use their running statistics and are
    not concerned.

    ## Why is this bad?
    BatchNorm normalises with the mean and variance of the current batch. With a few
    samples per device these are noisy estimates: training is noisier, and the running
    statistics used at evaluation do not match what the layers saw. Wu & He measured the
    ImageNet error of ResNet-50 rising quickly below 8 images per GPU (batch 2: +10 points),
    where GroupNorm stays flat. Under DataParallel/DDP the batch that matters is the
    per-device one.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=4)        # BatchNorm2d in the model
    ```

    ## Use instead
    ```python
    nn.GroupNorm(num_groups=8, num_channels=64)       # instead of BatchNorm2d(64)
    ```
    or a larger per-device batch, ``SyncBatchNorm`` across devices, or a frozen (eval-mode)
    BatchNorm when fine-tuning a pretrained model.

    ## References
    - Wu & He, "Group Normalization" (2018), figure 1: https://arxiv.org/abs/1803.08494
    """

    code = "B102"
    name = "batchnorm-tiny-batch"
    severity = Severity.WARNING
    summary = "BatchNorm trained with per-device batches < 8"
    fix = "use GroupNorm/LayerNorm, a larger per-device batch, SyncBatchNorm, or freeze BatchNorm (eval mode)"
    MIN_BATCH = 8
    MIN_FORWARDS = 3

    def __init__(self, session) -> None:
        super().__init__(session)
        self._sizes: dict[str, list[int]] = {}
        self._where: dict[str, Location | None] = {}
        self._reported: set[str] = set()

    def on_module_output(self, event: ModuleOutput) -> None:
        module = event.module
        if not isinstance(module, _BatchNorm) or not module.training or not torch.is_grad_enabled():
            return
        x = first_plain_tensor(event.inputs)
        if x is None or x.dim() < 2:
            return
        name = f"{type(event.root).__name__}.{event.qualname}"
        if name in self._reported:
            return
        sizes = self._sizes.setdefault(name, [])
        sizes.append(int(x.shape[0]))
        if name not in self._where:
            self._where[name] = event.location
        median = tiny_batch_verdict(sizes, self.MIN_BATCH, self.MIN_FORWARDS)
        if median is None:
            return
        self._reported.add(name)
        self.report(
            f"{name} ({type(module).__name__}) is trained on batches of {median:g} samples (median of "
            f"{len(sizes)} sampled forwards; threshold {self.MIN_BATCH}): its batch statistics are "
            "noisy and its running statistics will not match them at evaluation.",
            location=self._where[name],
            evidence={"layer": name, "median_batch": median, "batch_sizes": sizes[-8:],
                      "threshold": self.MIN_BATCH},
            step=event.step,
        )


def tiny_batch_verdict(sizes: list[int], min_batch: int, min_forwards: int) -> float | None:
    """The median batch size when it is below ``min_batch`` over enough forwards."""
    if len(sizes) < min_forwards:
        return None
    median = statistics.median(sizes)
    return median if median < min_batch else None


def stats_fingerprint(bn: _BatchNorm) -> torch.Tensor | None:
    """A small copy of the running mean and variance (no sync; compared on sampled steps)."""
    if bn.running_mean is None or bn.running_var is None:
        return None
    with torch.no_grad():
        return torch.cat([bn.running_mean.detach().reshape(-1)[:64],
                          bn.running_var.detach().reshape(-1)[:64]]).clone()


@register
class BatchNormStatsFrozen(Check):
    """
    ## What it does
    For every BatchNorm layer that runs in **training mode** in training forwards, keeps a
    small fingerprint of its running mean and variance after a sampled forward and compares
    it after later ones. If the statistics are identical after 3 training forwards spread
    over at least 2 optimizer steps, they are frozen: ``momentum=0``,
    ``track_running_stats`` switched off after construction, or running buffers replaced.

    Layers in eval mode are not reported: freezing a pretrained backbone's BatchNorm with
    ``.eval()`` is deliberate (and M102 covers a whole model left in eval mode).

    ## Why is this bad?
    Training uses batch statistics, evaluation uses the running ones. If those never
    change, evaluation normalises with their initial values (mean 0, variance 1) or with
    whatever was loaded, not with the statistics of the data the model now sees: training
    accuracy is fine and evaluation is wrong — the PyTorch form of the TensorFlow 1 bug
    where ``moving_mean`` is never updated because ``UPDATE_OPS`` are not run.

    ## Example
    ```python
    bn = nn.BatchNorm1d(64, momentum=0.0)          # running stats never move
    ```

    ## Use instead
    ```python
    bn = nn.BatchNorm1d(64)                        # momentum=0.1, or None for a cumulative average
    ```

    ## References
    - PyTorch docs, ``BatchNorm1d`` (momentum, track_running_stats): https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm1d.html
    """

    code = "B103"
    name = "batchnorm-stats-frozen"
    severity = Severity.ERROR
    summary = "training runs but BN running statistics never change"
    fix = "let running statistics update: momentum > 0 (default 0.1) and track_running_stats=True while training"
    needs = frozenset({"construction_sites"})
    MIN_FORWARDS = 3

    def __init__(self, session) -> None:
        super().__init__(session)
        self._first: dict[str, tuple[torch.Tensor, int, int]] = {}
        self._done: set[str] = set()

    def on_module_output(self, event: ModuleOutput) -> None:
        bn = event.module
        if not isinstance(bn, _BatchNorm) or not bn.training or not torch.is_grad_enabled():
            return
        name = f"{type(event.root).__name__}.{event.qualname}"
        if name in self._done:
            return
        current = stats_fingerprint(bn)
        if current is None:
            return
        first = self._first.get(name)
        if first is None:
            self._first[name] = (current, event.step, 1)
            return
        fingerprint, step0, seen = first
        if fingerprint.shape != current.shape or not torch.equal(fingerprint, current):
            self._done.add(name)  # they move: fine
            self._first.pop(name, None)
            return
        seen += 1
        self._first[name] = (fingerprint, step0, seen)
        if seen < self.MIN_FORWARDS or event.step - step0 < 2:
            return
        self._done.add(name)
        why = ("momentum=0" if bn.momentum == 0 else
               "track_running_stats=False" if not bn.track_running_stats else
               f"momentum={bn.momentum}")
        self.report(
            f"{name} ({type(bn).__name__}) runs in training mode but its running mean/variance did not "
            f"change over {seen} training forwards (steps {step0}–{event.step}); cause: {why}. "
            "Evaluation will normalise with stale statistics.",
            location=construction_site(self.session, bn) or event.location,
            evidence={"layer": name, "forwards": seen, "momentum": bn.momentum,
                      "track_running_stats": bn.track_running_stats},
            step=event.step,
        )
