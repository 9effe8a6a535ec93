"""What the model sees: D101–D109 (pixel scale, normalization, channel order and layout,
shuffling, non-finite and constant inputs, label range, train/eval overlap).

Inputs are read at the top-level model call (``Forward``, not a loss module), targets at
the loss call, labels at ``BatchFetched``; all statistics come from sampled steps.
"""

from __future__ import annotations

import weakref
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.conv import _ConvNd

from nndoctor.checks._rgb_evidence import source_evidence, takes_rgb_images
from nndoctor.core.events import (
    Backward,
    BatchFetched,
    Crash,
    EpochStart,
    Forward,
    LossComputed,
    ModuleOutput,
    RunEnd,
    StateDictLoad,
)
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.rules.image_batches import image_layout, unnormalized_pixels  # noqa: F401 - D101's rule, shared with Keras
from nndoctor.core.subscribers import model_forwards_only, sampled_only
from nndoctor.core.user_code import user_frame
from nndoctor.instrument.inputs_probe import sample_summary, target_range_records
from nndoctor.instrument.stats import (
    TensorStats,
    cached_stats,
    first_plain_tensor,
    model_input_tensor,
)

# ImageNet statistics (torchvision's pretrained weights), in RGB order on the 0–1 scale.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# -- pure functions ---------------------------------------------------------------------

def normalization_mismatch(minimum: float, maximum: float, channel_means: Sequence[float],
                           channel_stds: Sequence[float]) -> str | None:
    """D102: the signature of mean/std applied on the wrong pixel scale, or None.

    * 0–1 statistics (mean≈0.45, std≈0.22) on 0–255 pixels: ``(x - 0.485) / 0.229`` leaves
      the minimum just below zero (≥ -0.485/0.229 ≈ -2.1, bounded by -5 for any mean<1,
      std>0.2) and pushes the maximum to ~1100; anything above 50 is out of reach of a correct
      pipeline, including Caffe-style ``x - mean`` on 0–255 (its minimum is ≈ -124).
    * 0–255 statistics (mean≈120, std≈58) on 0–1 pixels: ``(x - 123.7) / 58.4`` puts every
      value of a channel in a band 1/58 ≈ 0.017 wide around -2: the batch is entirely
      negative and every channel's std is under 5% of its mean's magnitude (0.005 vs 2;
      with Caffe's std=1: 0.29 vs 120). Correctly standardised images have channel stds
      near 1 and means near 0.
    """
    if -5.0 <= minimum < 0 and maximum > 50:
        return "unit-stats-on-255-pixels"
    if maximum < 0 and channel_means and len(channel_means) == len(channel_stds) and all(
        0 < s < 0.05 * abs(m) for m, s in zip(channel_means, channel_stds)
    ):
        return "255-stats-on-unit-pixels"
    return None


# Per-channel mean/std on the 0–1 scale that image pipelines apply: (name, mean, std).
UNIT_SCALE_STATISTICS = (
    ("ImageNet", IMAGENET_MEAN, IMAGENET_STD),
    ("CLIP", (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    ("0.5", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
)
# Back-mapped pixels may overshoot 0–255 by float rounding; beyond this they are not pixels.
_PIXEL_SLACK = 0.5


@dataclass(frozen=True)
class UnitStatsOn255:
    """D102's exact form: per channel c the input is ``(x - mean[c]) / std[c]`` with ``x`` in 0–255."""

    name: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    pixel_max: float  # the largest pixel value the input maps back to
    integral: bool  # the values map back to whole numbers: 8-bit pixels, exactly


def unit_stats_on_255_pixels(channel_min: Sequence[float], channel_max: Sequence[float],
                             offsets: Sequence[float], input_max: float) -> UnitStatsOn255 | None:
    """D102: which 0–1 mean/std turn 0–255 pixels into this input, or None.

    Every channel's range, mapped back with ``x = v * std + mean``, must lie within 0–255 and
    reach beyond 25 somewhere (0–1 pixels map back below 1.1). ``offsets`` are the mean
    distances of the back-mapped values to the nearest integer, per candidate (same order as
    ``UNIT_SCALE_STATISTICS``). A candidate is accepted when its values map back to whole
    numbers (8-bit pixels, exactly), or, for resampled images whose values are no longer
    whole, when the input exceeds 255 (it cannot be raw 8-bit pixels) and maps back to pixels
    reaching the upper half of 0–255. Raw 0–255 pixels also fit a range (their back-mapped
    maximum is 59 for ImageNet) but map back to fractions: they stay D101's.
    """
    fits = []
    for index, (name, mean, std) in enumerate(UNIT_SCALE_STATISTICS):
        if len(channel_min) != len(mean) or len(channel_max) != len(mean) or index >= len(offsets):
            continue
        low = [v * s + m for v, s, m in zip(channel_min, std, mean)]
        high = [v * s + m for v, s, m in zip(channel_max, std, mean)]
        if min(low) < -_PIXEL_SLACK or max(high) > 255 + _PIXEL_SLACK or max(high) <= 25:
            continue
        integral = offsets[index] < 0.01
        if integral or (input_max > 255 + _PIXEL_SLACK and max(high) > 128):
            fits.append(UnitStatsOn255(name, tuple(mean), tuple(std), max(high), integral))
    if not fits:
        return None
    return next((f for f in fits if f.integral), fits[0])


def backmapped_integer_offsets(x: torch.Tensor, layout: str, count: int = 3072) -> list[float]:
    """For each candidate of ``UNIT_SCALE_STATISTICS``: the mean distance to the nearest integer
    of up to ``count`` evenly spaced input values mapped back to pixels (one small host copy)."""
    with torch.no_grad():
        channels = x.detach().movedim(1 if layout == "nchw" else -1, 0).reshape(3, -1).float()
        picked = channels[:, torch.linspace(0, channels.shape[1] - 1, min(count // 3, channels.shape[1]),
                                            device=channels.device).long()].cpu().double()
    offsets = []
    for _, mean, std in UNIT_SCALE_STATISTICS:
        pixels = picked * torch.tensor(std, dtype=torch.float64)[:, None] + torch.tensor(mean, dtype=torch.float64)[:, None]
        offsets.append(float((pixels - pixels.round()).abs().mean()))
    return offsets


def unit_stats_signature(event: Any, stats: TensorStats) -> UnitStatsOn255 | None:
    """``unit_stats_on_255_pixels`` of a Forward event's input, once per event (D101 and D102
    both ask). Reads the tensor only when the whole-batch range allows it (a 3-channel image
    batch with values above 25 and none below about -2.2): per-channel min/max and a sample."""
    key = "d102:unit-stats-on-255"
    if key in event.cache:
        return event.cache[key]
    found = None
    layout = image_layout(stats.shape)
    channels = stats.shape[1] if layout == "nchw" else stats.shape[-1] if layout else 0
    if layout and channels == 3 and stats.is_floating and stats.finite and stats.max > 25 and stats.min >= -2.2:
        x = model_input_tensor(event.inputs, event.kwargs)
        if x is not None and tuple(x.shape) == tuple(stats.shape):
            dims = (0, 2, 3) if layout == "nchw" else (0, 1, 2)
            with torch.no_grad():
                low, high = x.detach().float().amin(dim=dims), x.detach().float().amax(dim=dims)
                bounds = torch.cat([low, high]).cpu().tolist()
            found = unit_stats_on_255_pixels(bounds[:3], bounds[3:], backmapped_integer_offsets(x, layout),
                                              stats.max)
    event.cache[key] = found
    return found


# ImageNet-standardised pixels stay within about [-2.12, 2.64]; beyond ±5 an input is not that.
_STANDARDISED_LIMIT = 5.0


def unit_rgb_means(channel_means: Sequence[float], minimum: float, maximum: float) -> tuple[float, float, float] | None:
    """Per-channel means of a 3-channel batch mapped back to the 0–1 pixel scale.

    0–1 input is used as is, 0–255 input divided by 255, [-1, 1] input (mean/std 0.5)
    mapped back, and any other standardised input is assumed to use the ImageNet
    statistics (the only case where RGB order is usually *required*: pretrained weights).
    """
    if len(channel_means) != 3:
        return None
    if minimum >= 0 and maximum <= 1.0 + 1e-6:
        return tuple(channel_means)  # type: ignore[return-value]
    if minimum >= 0 and maximum <= 255.5:
        return tuple(m / 255.0 for m in channel_means)  # type: ignore[return-value]
    if minimum >= -1.0 - 1e-6 and maximum <= 1.0 + 1e-6:
        return tuple((m + 1.0) / 2.0 for m in channel_means)  # type: ignore[return-value]
    if minimum < -_STANDARDISED_LIMIT or maximum > _STANDARDISED_LIMIT:
        return None  # on no scale this knows (0–1 statistics on 0–255 pixels: D102's)
    return tuple(m * s + mu for m, s, mu in zip(channel_means, IMAGENET_STD, IMAGENET_MEAN))  # type: ignore[return-value]


def red_minus_blue(unit_means: Sequence[float]) -> float:
    """D103 per-batch statistic: mean of channel 0 minus mean of channel 2 (0–1 scale).

    Natural RGB photographs are warmer than they are blue on average (ImageNet:
    R 0.485 > B 0.406); BGR order flips the sign.
    """
    return float(unit_means[0] - unit_means[2])


# D103 decision, measured by benchmarks/d103_channel_order.py (see the check's docs).
CHANNEL_ORDER_MIN_BATCHES = 8
CHANNEL_ORDER_THRESHOLD = -0.03


def channel_order_swapped(scores: Sequence[float], min_batches: int = CHANNEL_ORDER_MIN_BATCHES,
                          threshold: float = CHANNEL_ORDER_THRESHOLD) -> bool:
    """True when at least ``min_batches`` batch scores average below ``threshold``.

    Averaging over batches (typically ≥ 128 images) shrinks the spread that single scenes
    give a single batch; gray or neutral data scores 0 and never fires.
    """
    return len(scores) >= min_batches and sum(scores) / len(scores) < threshold


def channels_last_into_conv(input_shape: Sequence[int], conv_input_shape: Sequence[int] | None,
                            conv_in_channels: int | None) -> bool:
    """D104: an N,H,W,C batch reaches the first Conv2d unchanged, read as C=H channels."""
    if image_layout(input_shape) != "nhwc" or conv_input_shape is None:
        return False
    if tuple(conv_input_shape) != tuple(input_shape):
        return False  # the model permuted (or otherwise reshaped) its input first
    return conv_in_channels == input_shape[1]


def dominant_fraction(labels: Sequence[int]) -> tuple[int, float]:
    """(most common label, its share of the batch)."""
    counts = Counter(labels)
    label, count = counts.most_common(1)[0]
    return label, count / len(labels)


# D105: a batch counts as single-class when one label holds >= 90% of it.
DOMINANT_SHARE = 0.9
UNSHUFFLED_MIN_BATCHES = 4
UNSHUFFLED_MIN_BATCH_SIZE = 8


def unshuffled_evidence(batches: Sequence[tuple[int, float, int]]) -> tuple[int, int] | None:
    """D105: ``batches`` = (dominant label, its share, batch size) of consecutive training
    batches. Returns (single-class batches, distinct dominant labels) when the data looks
    sorted by label: at least 4 batches of ≥ 8 samples, ≥ 75% of them single-class, and the
    dominant label changes between batches (an imbalanced but shuffled dataset has the same
    dominant label everywhere)."""
    usable = [b for b in batches if b[2] >= UNSHUFFLED_MIN_BATCH_SIZE]
    if len(usable) < UNSHUFFLED_MIN_BATCHES:
        return None
    single = [b for b in usable if b[1] >= DOMINANT_SHARE]
    distinct = len({b[0] for b in single})
    if len(single) >= 0.75 * len(usable) and distinct >= 2:
        return len(single), distinct
    return None


def batch_label_summary(labels: torch.Tensor) -> tuple[int, float, int]:
    """(dominant label, its share, batch size) of a batch's class labels.

    Labels on the CPU (a DataLoader's own output: read on every batch) are counted by NumPy
    on the tensor's memory, ~10 µs for a batch where torch's ``mode``, comparison, ``sum``,
    ``stack`` and ``tolist`` took ~60; labels on an accelerator by torch, in one copy to the
    host. Both give the smallest label on a tie, as ``torch.mode`` does on the CPU."""
    if labels.device.type == "cpu":
        return _host_label_summary(labels.detach().reshape(-1).numpy())
    return device_label_summary(labels)


def _host_label_summary(values: Any) -> tuple[int, float, int]:
    import numpy as np

    values = values[values >= 0]  # ignore_index and other negative markers
    if not values.size:
        return (-1, 0.0, 0)
    if values.max() < _BINCOUNT_LIMIT:
        counts = np.bincount(values.astype(np.intp, copy=False))  # (uint64 does not cast safely)
        label = int(counts.argmax())  # the first of the largest counts: the smallest label
        count = int(counts[label])
    else:  # ids too large for an array of counts (hashed ids): sorted unique values instead
        unique, counts = np.unique(values, return_counts=True)
        best = int(counts.argmax())
        label, count = int(unique[best]), int(counts[best])
    return (label, count / values.size, int(values.size))


_BINCOUNT_LIMIT = 1 << 16


def device_label_summary(labels: torch.Tensor) -> tuple[int, float, int]:
    """``batch_label_summary`` in torch ops, for labels on an accelerator (one copy to the host)."""
    with torch.no_grad():
        values = labels.detach().reshape(-1)
        values = values[values >= 0]  # ignore_index and other negative markers
        if not values.numel():
            return (-1, 0.0, 0)
        top = values.mode().values  # no array sized by the largest label (ids can be huge)
        # The label and its count in one copy to the host (on a GPU each read is a synchronisation),
        # in a type that holds both exactly (not the labels' own: a uint8 count would wrap).
        wide = torch.float64 if top.is_floating_point() else torch.int64
        label, count = torch.stack((top.to(wide), (values == top).sum().to(wide))).tolist()
        return (int(label), float(count) / values.numel(), int(values.numel()))


class LabelOrder:
    """D105's running tally over every training batch of one loader, in constant memory:
    usable batches, single-class batches per dominant label (at most ``_MAX_LABELS`` labels),
    and the first and last few batch summaries for the evidence."""

    _MAX_LABELS = 1024
    _KEPT = 8
    # Settled: this many usable batches with at most this share single-class. Reaching the 75%
    # of ``evidence`` from there takes more than 700 single-class batches in a row, and a
    # sampler's order does not change its nature mid-run (a shuffling sampler shuffles every
    # pass): D105 then reads the loader's labels on sampled steps only (~10 µs a batch saved).
    SETTLE_BATCHES = 256
    SETTLE_SHARE = 0.05

    def __init__(self) -> None:
        self.settled = False
        self.usable = 0
        self.single = 0
        self.dominant: dict[int, int] = {}
        self.first: list[tuple[int, float, int]] = []
        self.last: deque[tuple[int, float, int]] = deque(maxlen=self._KEPT)
        self._run: tuple[int, int] = (-1, 0)  # (label, length) of the current single-class run
        self.longest: tuple[int, int] = (-1, 0)

    def add(self, summary: tuple[int, float, int]) -> None:
        label, share, size = summary
        if size < UNSHUFFLED_MIN_BATCH_SIZE:
            return
        self.usable += 1
        if share >= DOMINANT_SHARE:
            self.single += 1
            if label in self.dominant or len(self.dominant) < self._MAX_LABELS:
                self.dominant[label] = self.dominant.get(label, 0) + 1
            self._run = (label, self._run[1] + 1 if self._run[0] == label else 1)
            if self._run[1] > self.longest[1]:
                self.longest = self._run
        else:
            self._run = (-1, 0)
        (self.first if len(self.first) < self._KEPT else self.last).append(summary)
        if not self.settled and self.usable >= self.SETTLE_BATCHES:
            self.settled = self.single <= self.SETTLE_SHARE * self.usable

    def evidence(self) -> tuple[int, int] | None:
        """(single-class batches, distinct dominant labels) under ``unshuffled_evidence``'s rule,
        over every batch seen so far (not a fixed prefix: a first class block may span hundreds)."""
        if self.usable < UNSHUFFLED_MIN_BATCHES:
            return None
        if self.single >= 0.75 * self.usable and len(self.dominant) >= 2:
            return self.single, len(self.dominant)
        return None


def chance_of_single_class_batch(classes: int, batch_size: int) -> float:
    """Probability that a shuffled batch of balanced classes is all one class (for messages)."""
    return classes * (1.0 / classes) ** batch_size


def label_tensor(batch: Any) -> torch.Tensor | None:
    """The class-label tensor of a batch: the second item of (x, y) or a ``label``/``target``
    key, when it is a 1-D integer tensor."""
    candidate = None
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        candidate = batch[1]
    elif isinstance(batch, dict):
        for key in ("label", "labels", "target", "targets", "y"):
            if key in batch:
                candidate = batch[key]
                break
    if isinstance(candidate, torch.Tensor) and candidate.dim() == 1 and not candidate.is_floating_point() \
            and candidate.dtype != torch.bool and candidate.numel() > 0:
        return candidate
    return None


def binary_target_outside_unit(minimum: float, maximum: float) -> bool:
    """D107 for BCE losses: targets must be probabilities in [0, 1]."""
    return minimum < 0 or maximum > 1


# -- shared bookkeeping -----------------------------------------------------------------

_LEARNED_LAYERS = (_ConvNd, nn.Linear)


@dataclass(frozen=True)
class FirstLayerInput:
    """What the first Conv/Linear layer of a model received in one forward pass."""

    qualname: str
    layer_type: str
    in_channels: int | None
    stats: TensorStats


class FirstLayerWatch:
    """Per root model, the input of its first Conv/Linear layer in the current pass.

    Tells whether the model rescales or permutes its input itself (``x / 255`` or
    ``x.permute(0, 3, 1, 2)`` in ``forward``), in which case a raw input is no bug.
    Submodule outputs arrive (sampled steps only) before the root's own forward event, so
    the first learned layer to finish is the first one the data went through.
    """

    def __init__(self) -> None:
        self._first: dict[int, FirstLayerInput] = {}

    def observe(self, event: ModuleOutput) -> None:
        key = id(event.root)
        if key in self._first or not isinstance(event.module, _LEARNED_LAYERS):
            return
        stats = cached_stats(event, "input0", first_plain_tensor(event.inputs))
        if stats is None:
            return
        module = event.module
        channels = getattr(module, "in_channels", getattr(module, "in_features", None))
        if len(self._first) > 64:
            self._first.clear()
        self._first[key] = FirstLayerInput(event.qualname, type(module).__name__, channels, stats)

    def take(self, root: object) -> FirstLayerInput | None:
        return self._first.pop(id(root), None)


def _model_input(check: Check, event: Forward) -> TensorStats | None:
    """Statistics of the first tensor given to a model (sampled steps, not loss modules)."""
    if not event.sampled or event.is_loss:
        return None
    # model(**batch): Hugging Face Trainer and accelerate loops call with keywords only
    return cached_stats(event, "input0", model_input_tensor(event.inputs, event.kwargs))


def _model_name(event: Forward) -> str:
    return type(event.module).__name__


# -- checks -----------------------------------------------------------------------------

@register
class UnnormalizedInput(Check):
    """
    ## What it does
    Flags image batches (N,C,H,W or N,H,W,C with 1, 3 or 4 channels) that reach the model's
    first Conv/Linear layer still in raw pixel units: `uint8` tensors, or float values from
    0 up to 255 (maximum above 25), or beyond 255 (16-bit data).

    On Keras 3 it reads the data given to ``fit``/``evaluate`` and, on the TensorFlow backend,
    the first batch a custom ``GradientTape`` loop gives its model. There it also covers
    images flattened to one row (N, side²·channels, e.g. 784 = 28² MNIST columns, 3072 =
    32²·3) when they are clearly raw pixels: whole numbers in [0, 255] (``uint8``, or floats
    with a maximum above 100) going into a first ``Dense`` layer.

    ## Why is this bad?
    Weights are initialised (and pretrained) for inputs of unit scale. Inputs 255 times too
    large saturate activations, blow up the first layer's gradients and make the learning
    rate effectively 65 000 times too large for the first layer: training diverges or
    crawls. The usual cause: `img.float()` without `/ 255` (or a custom
    loader that skips `ToTensor()`).

    The threshold 25 is ten times the largest value of an ImageNet-standardised image
    ((1 - 0.406) / 0.225 ≈ 2.64), so neither 0–1 nor standardised data can reach it. When
    the model itself divides by 255 before its first learned layer, the first layer's input
    is small and nothing is reported.

    ## Example
    ```python
    img = torch.from_numpy(cv2.imread(path)).permute(2, 0, 1).float()   # 0..255
    logits = model(img[None])
    ```

    ## Use instead
    ```python
    img = torch.from_numpy(cv2.imread(path)).permute(2, 0, 1).float() / 255
    img = transforms.Normalize(mean, std)(img)
    ```

    ## References
    - torchvision `ToTensor` / `Normalize`: https://pytorch.org/vision/stable/transforms.html
    """

    code = "D101"
    name = "unnormalized-input"
    severity = Severity.ERROR
    summary = "image batches still in the 0–255 range (or integer tensors) fed to the model"
    fix = "divide pixels by 255 (ToTensor()) and normalize with the mean/std of your data or pretrained weights"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._first = FirstLayerWatch()

    def on_module_output(self, event: ModuleOutput) -> None:
        self._first.observe(event)

    @sampled_only  # the first layer's input is recorded on sampled steps only
    @model_forwards_only
    def on_forward(self, event: Forward) -> None:
        if not event.sampled or event.is_loss:
            return
        first = self._first.take(event.module)
        stats = _model_input(self, event)
        if stats is None and first is not None:
            # Called with keyword arguments only (``model(pixel_values=x)``, as Hugging Face
            # Trainer does), the batch is not among the positional inputs the forward hook
            # sees: the first learned layer's input is the best view of it.
            stats = first.stats
        if stats is None or first is None or image_layout(stats.shape) is None:
            return
        problem = unnormalized_pixels(stats.dtype, stats.min, stats.max)
        # What the first learned layer saw decides: the model may scale its input itself.
        if problem is None or first.stats.max <= 25:
            return
        if stats.is_floating and unit_stats_signature(event, stats) is not None:
            return  # normalised, with 0–1 statistics on 0–255 pixels: D102 names it
        self.report(
            f"{_model_name(event)} receives {problem}: input {stats.describe()}; its first layer "
            f"{first.qualname} ({first.layer_type}) sees values up to {first.stats.max:.4g} "
            "(normalised images stay within about ±3).",
            location=event.location,
            evidence={"input_shape": list(stats.shape), "dtype": stats.dtype, "min": stats.min,
                      "max": stats.max, "mean": stats.mean, "first_layer": first.qualname,
                      "first_layer_input_max": first.stats.max},
            step=event.step,
        )


@register
class NormalizationScaleMismatch(Check):
    """
    ## What it does
    Recognises the two signatures of mean/std normalisation applied on the wrong pixel
    scale, in image batches given to a model:

    * 0–1 statistics on 0–255 pixels, `(x - 0.485) / 0.229` with `x` up to 255: the minimum
      stays just below zero (above -5) while the maximum exceeds 50 (it reaches ~1100);
    * 0–255 statistics on 0–1 pixels, `(x - 123.7) / 58.4` with `x` up to 1: the whole batch
      is negative and squeezed into a band narrower than 5% of its magnitude (~0.017 wide
      around -2). Pixels divided by 255 twice (`ToTensor()`, then an image processor with
      `do_rescale=True`) and normalised with mean = std = 0.5 give the same signature: all
      values in [-1, -0.992].

    The first signature is also matched exactly, channel by channel: when the input is
    `(x - mean[c]) / std[c]` of pixels `x` in 0–255 for the ImageNet, CLIP or 0.5 statistics
    (each channel's range maps back into 0–255, and the values map back to whole pixel
    values, or exceed 255 so they cannot be raw pixels), D102 names the constants, even when
    no pixel is black and every value is positive (about [69, 1000]); D101 then stays silent.
    Inputs given as keyword arguments (`model(pixel_values=...)`) are read too.

    ## Why is this bad?
    Mean/std come in two scales — small (0–1, torchvision) or large
    (0–255, Caffe/mmdetection) — and must match how pixels were prepared. Mixing them gives
    inputs 250 times too large, or images with all contrast squeezed out: a pretrained
    network sees garbage and training from scratch is badly conditioned. Correct pipelines
    cannot produce either signature: standardised images span about -2.1…2.7, Caffe-style
    `x - mean` on 0–255 goes down to about -124.

    ## Example
    ```python
    normalize = transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    x = normalize(torch.from_numpy(img).permute(2, 0, 1).float())     # img in 0..255
    ```

    ## Use instead
    ```python
    x = normalize(torch.from_numpy(img).permute(2, 0, 1).float() / 255)
    # or keep 0..255 and use mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]
    ```

    ## References
    - torchvision `Normalize` (expects tensors in [0, 1] after `ToTensor`): https://pytorch.org/vision/stable/generated/torchvision.transforms.Normalize.html
    - Hugging Face, `ViTImageProcessor` (`do_rescale`, `rescale_factor=1/255`): https://huggingface.co/docs/transformers/model_doc/vit#transformers.ViTImageProcessor
    """

    code = "D102"
    name = "normalization-scale-mismatch"
    severity = Severity.ERROR
    summary = "normalized inputs far outside unit scale: 0–1 mean/std on 0–255 pixels, or the reverse"
    fix = ("use mean/std on the same scale as the pixels: x/255 with 0–1 statistics, or 0–255 pixels with 0–255 "
           "statistics; rescale once (an image processor after ToTensor() needs do_rescale=False)")

    @sampled_only
    def on_forward(self, event: Forward) -> None:
        if not event.sampled:
            return  # _model_input reads sampled steps only
        stats = _model_input(self, event)
        if stats is None or not stats.is_floating or not stats.finite or image_layout(stats.shape) is None:
            return
        layout = image_layout(stats.shape)
        means, stds = ((stats.channel_mean_dim1, stats.channel_std_dim1) if layout == "nchw"
                       else (stats.channel_mean_last, stats.channel_std_last))
        kind = normalization_mismatch(stats.min, stats.max, means or (), stds or ())
        exact = unit_stats_signature(event, stats)
        if kind is None and exact is not None:
            kind = "unit-stats-on-255-pixels"
        if kind is None:
            return
        extra: dict[str, Any] = {}
        if kind == "unit-stats-on-255-pixels" and exact is not None:
            constants = (f"mean ({', '.join(f'{m:g}' for m in exact.mean)}) and std "
                         f"({', '.join(f'{v:g}' for v in exact.std)})")
            how = ("every sampled value maps back to a whole pixel value" if exact.integral
                   else "every channel's range maps back into 0–255")
            what = (f"values span [{stats.min:.4g}, {stats.max:.4g}] (mean {stats.mean:.4g}): per channel they are "
                    f"(x − mean) / std of 0–255 pixels x with the {exact.name} {constants} ({how}, up to "
                    f"{exact.pixel_max:.0f}): 0–1 mean/std were applied to 0–255 pixels")
            extra = {"matched_statistics": exact.name, "matched_mean": list(exact.mean), "matched_std": list(exact.std),
                     "integer_pixels": exact.integral}
        elif kind == "unit-stats-on-255-pixels":
            what = (f"values reach {stats.max:.4g} while the minimum is {stats.min:.3g} (just below 0): "
                    "0–1 mean/std were applied to 0–255 pixels")
        else:
            spread = ", ".join(f"{m:.3g}±{s:.2g}" for m, s in zip(means or (), stds or ()))
            what = (f"every value lies in [{stats.min:.4g}, {stats.max:.4g}] and each channel is squeezed into a "
                    f"narrow band (mean±std per channel: {spread}): 0–255 mean/std were applied to 0–1 pixels, "
                    "or 0–1 pixels were divided by 255 a second time (ToTensor() and then an image processor "
                    "with do_rescale=True); either way the contrast is erased")
        self.report(
            f"{_model_name(event)} input {list(stats.shape)}: {what}.",
            location=event.location,
            evidence={"kind": kind, "min": stats.min, "max": stats.max, "mean": stats.mean, "std": stats.std,
                      "channel_means": list(means or ()), "channel_stds": list(stds or ()), **extra},
            step=event.step,
        )


@register
class ChannelOrderSwapped(Check):
    """
    ## What it does
    Looks for BGR images (OpenCV's `cv2.imread` order) where RGB is expected. On every
    sampled batch of 3-channel images given to a model, it maps the per-channel
    means back to the 0–1 pixel scale (raw 0–1, raw 0–255, [-1, 1], otherwise assuming
    ImageNet standardisation) and computes the statistic *d = mean(channel 0) − mean(channel 2)*.
    Natural RGB photographs are warmer than blue on average (ImageNet: R 0.485, B 0.406), so
    *d* is usually positive; BGR order flips its sign. The check fires when *d*, averaged
    over the last 8 sampled batches, is below −0.03 (the average over ≥ 100 images
    smooths out single scenes; gray or colour-neutral data gives 0 and never fires).

    Measured by `benchmarks/d103_channel_order.py` (batches of 16 random crops, 48–160 px,
    ImageNet-normalised and scored through the check's own code; one decision = 8 batches):

    | photographs | false positives (RGB) | detections (same crops, BGR) |
    |---|---|---|
    | scikit-learn's two (china, flower), 2000 decisions | **0.0%** | **74.1%** |
    | + scikit-image astronaut, chelsea, coffee, rocket, 300 decisions | 0.0% | 100.0% |
    | china alone / flower alone | 0.0% / 0.0% | 13.3% / 93.0% |
    | astronaut, chelsea, coffee, each alone | 0.0% | 100.0% |
    | rocket alone (night sky: bluer than red) | 100.0% | 0.0% |

    Synthetic inputs, where channel order means nothing (same benchmark, `--synthetic`,
    250 decisions = 32,000 images each; the statistic in the order generated):

    | synthetic input | statistic fires | reported as a warning |
    |---|---|---|
    | uniform noise, Gaussian noise, smooth random colour fields | 0.0% | 0% |
    | random coloured shapes | 13.6% | 0% (info) without RGB evidence |
    | outputs of an untrained DCGAN-style generator (tanh) | 100.0% | 0% (info) without RGB evidence |

    Natural photographs at the same 250 decisions (32,000 crops): scikit-learn's two photos
    0.0% false positives (74–78% detection); the same crops mirrored and jittered ±20% in
    brightness, contrast and saturation 0.0% (73.2% detection).

    Because the statistic cannot tell "BGR photographs" from "data whose channel order does
    not matter" (the generator row), the finding is a **warning only with evidence that the
    pipeline assumes RGB**: weights loaded into a model with a 3-channel convolution
    (`load_state_dict`, which torchvision/timm/hub pretrained weights go through), ImageNet's
    normalisation constants (0.485/0.406, `IMAGENET_DEFAULT_MEAN`), pretrained weights
    requested (`weights="DEFAULT"`, `pretrained=True`, `from_pretrained`, `torch.hub.load`)
    or images read with OpenCV (`cv2.imread`), found in the code (comments and docstrings
    aside) of the file that calls the model and of the modules imported from its folder.
    Without such evidence it is reported as info.

    A single batch alone would give 9.0% false positives on the scikit-learn crops: hence
    the 8-batch average. Known false positives, by construction: datasets whose images
    are bluer than red on average (night sky — scikit-image's `rocket` alone —, underwater,
    open water from satellites) look like BGR; the message says so. Colour-neutral
    scenes (china: R ≈ B) are rarely detected when swapped. Inputs normalised with other
    statistics than ImageNet's are mapped back approximately, which biases *d* toward
    "RGB" (fewer detections, not more).

    ## Why is this bad?
    A network pretrained on RGB images (every torchvision and timm model) given BGR images
    sees skies as red and skin as blue: fine-tuning still "works" but starts from weaker
    features and ends several points lower, silently. Images loaded with OpenCV come as
    BGR (and H,W,C) and must be converted.

    ## Example
    ```python
    img = cv2.imread(path)                              # BGR
    x = normalize(torch.from_numpy(img).permute(2, 0, 1).float() / 255)
    ```

    ## Use instead
    ```python
    img = cv2.cvtColor(cv2.imread(path), cv2.COLOR_BGR2RGB)
    ```
    A model trained from scratch on BGR data consistently (training and inference) is not
    wrong; ignore D103 there.

    ## References
    - OpenCV docs, `cv::imread` ("the image is stored in B G R order"): https://docs.opencv.org/4.x/d4/da8/group__imgcodecs.html
    - ImageNet channel means used by torchvision: https://pytorch.org/vision/stable/models.html
    - Measurement: benchmarks/d103_channel_order.py.
    """

    code = "D103"
    name = "channel-order-swapped"
    severity = Severity.WARNING
    heuristic = True
    false_positives = (
        "0.0% of 2,000 decisions (8 batches of 16 crops each) on scikit-learn's two sample photographs, "
        "74.1% detection when the same crops are swapped to BGR; the statistic fires on synthetic images "
        "(13.6% on random coloured shapes, 100% on an untrained generator's outputs), reported as info "
        "unless the pipeline shows it expects RGB (benchmarks/d103_channel_order.py)."
    )
    summary = "strong statistical evidence that 3-channel natural images arrive as BGR where RGB is expected"
    fix = "convert OpenCV images with cv2.cvtColor(img, cv2.COLOR_BGR2RGB) (or img[..., ::-1]) before ToTensor/normalize"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._scores: list[float] = []
        self._reported = False
        self._loaded_weights: list[str] = []

    def on_state_dict_load(self, event: StateDictLoad) -> None:
        module = event.module
        if module is not None and not self._loaded_weights and takes_rgb_images(module):
            self._loaded_weights.append(
                f"weights were loaded into {type(module).__name__} with load_state_dict (pretrained or resumed)")

    def rgb_evidence(self, event: Forward) -> list[str]:
        frame = user_frame(event.frame)
        return self._loaded_weights + source_evidence(frame.f_code.co_filename if frame else None)

    @sampled_only
    def on_forward(self, event: Forward) -> None:
        if not event.sampled or self._reported:
            return  # _model_input reads sampled steps only
        stats = _model_input(self, event)
        if stats is None or not stats.is_floating or not stats.finite:
            return
        layout = image_layout(stats.shape)
        means = stats.channel_mean_dim1 if layout == "nchw" else stats.channel_mean_last if layout else None
        if means is None or len(means) != 3:
            return
        unit = unit_rgb_means(means, stats.min, stats.max)
        if unit is None:
            return
        self._scores.append(red_minus_blue(unit))
        if len(self._scores) > 64:
            del self._scores[: len(self._scores) - 64]
        recent = self._scores[-CHANNEL_ORDER_MIN_BATCHES:]
        if not channel_order_swapped(recent):
            return
        self._reported = True
        evidence = self.rgb_evidence(event)
        why = (f"RGB order is assumed here: {'; '.join(evidence)}. " if evidence else
               "No sign that this pipeline assumes RGB (no weights loaded into the model, no ImageNet "
               "constants, no OpenCV reads), so channel order may not matter here (synthetic data, a model "
               "trained from scratch): reported as info. ")
        self.report(
            why +
            f"Over the last {len(recent)} image batches given to {_model_name(event)}, channel 2 is brighter "
            f"than channel 0: mean(ch0) − mean(ch2) averages {sum(recent) / len(recent):.3f} on the 0–1 scale "
            f"(per batch {min(recent):.3f} to {max(recent):.3f}; fires below {CHANNEL_ORDER_THRESHOLD} averaged over "
            f"≥{CHANNEL_ORDER_MIN_BATCHES} batches). Natural RGB photos are redder than blue on average, so these "
            "look like BGR (OpenCV) images. Ignore this if your images are genuinely blue-dominated "
            "(underwater, sky) or the model was trained on BGR from scratch.",
            location=event.location,
            evidence={"scores": [round(s, 4) for s in recent], "threshold": CHANNEL_ORDER_THRESHOLD,
                      "batches": len(recent), "rgb_evidence": evidence},
            severity=Severity.WARNING if evidence else Severity.INFO,
            step=event.step,
        )


@register
class ChannelsLastInput(Check):
    """
    ## What it does
    Flags an image batch laid out N,H,W,C (last dimension 1, 3 or 4; H and W ≥ 8) that
    reaches the model's first Conv layer unchanged, where the layer has `in_channels == H`
    — it reads image rows as channels. The mistake only runs silently when the first layer
    was sized to match (`LazyConv2d`, or `in_channels` "fixed" to 32/224 after a shape
    error); otherwise it crashes with E104. Models that permute their input first are not
    reported (the first Conv then sees a different shape).

    ## Why is this bad?
    The convolution then mixes pixels of a column as if they were colours and slides over
    the width and the colour axis: the network trains on scrambled images and plateaus far
    below what the data allows. Images opened with PIL/OpenCV are
    H,W,C; PyTorch expects C,H,W.

    ## Example
    ```python
    x = torch.from_numpy(images).float() / 255        # (N, 32, 32, 3)
    model = nn.Sequential(nn.LazyConv2d(16, 3), ...)
    ```

    ## Use instead
    ```python
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255   # (N, 3, 32, 32)
    ```

    ## References
    - PyTorch docs, `Conv2d` (input is N, C, H, W): https://pytorch.org/docs/stable/generated/torch.nn.Conv2d.html
    - PyTorch docs, `Tensor.permute`: https://pytorch.org/docs/stable/generated/torch.Tensor.permute.html
    """

    code = "D104"
    name = "channels-last-input"
    severity = Severity.ERROR
    summary = "image batches laid out N,H,W,C given to layers that expect N,C,H,W"
    fix = "permute images to N,C,H,W (x.permute(0, 3, 1, 2)) and give the first conv in_channels=C"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._first = FirstLayerWatch()

    def on_module_output(self, event: ModuleOutput) -> None:
        if isinstance(event.module, _ConvNd):
            self._first.observe(event)

    @sampled_only  # the first convolution's input is recorded on sampled steps only
    @model_forwards_only
    def on_forward(self, event: Forward) -> None:
        if not event.sampled or event.is_loss:
            return
        first = self._first.take(event.module)
        if first is None:
            return
        tensor = model_input_tensor(event.inputs, event.kwargs)
        if tensor is None:
            return
        shape = tuple(tensor.shape)
        if not channels_last_into_conv(shape, first.stats.shape, first.in_channels):
            return
        self.report(
            f"{_model_name(event)} receives images shaped {list(shape)} (N,H,W,C with C={shape[3]}) and its "
            f"first conv {first.qualname} reads dimension 1 as {first.in_channels} channels: image rows "
            "are treated as colour channels.",
            location=event.location,
            evidence={"input_shape": list(shape), "first_conv": first.qualname, "in_channels": first.in_channels},
            step=event.step,
        )


@register
class UnshuffledTrainingData(Check):
    """
    ## What it does
    Watches the class labels (`y` of `(x, y)` batches, or a `label`/`target` key) of the
    batches that are followed by a `backward()` — training batches — per DataLoader. When
    at least 4 batches of ≥ 8 samples have been seen and ≥ 75% of them are single-class
    (one label holds ≥ 90% of the batch) *and* those batches are dominated by at least two
    different labels, the data arrives sorted by class.

    The tally runs over every training batch of the run, not a fixed prefix, in constant
    memory (counts, and the first and last 8 batch summaries): a first class that spans
    hundreds of batches (IMDB sorted by label: about 390 batches of 32) is reported at the
    first batch of the second class. Labels still on the CPU are read on every batch (one
    `mode` over the batch, no device synchronisation); labels already on an accelerator
    only on sampled steps.

    With C balanced classes a shuffled batch of B samples is single-class with probability
    C·(1/C)^B (0.8% for C=2, B=8; far less for more classes), so three such batches out of
    four do not happen by chance. A heavily imbalanced dataset produces single-class
    batches of the *same* class, which the two-labels rule excludes. Validation loaders
    (`shuffle=False` is right there) are not followed by `backward()` and are ignored.

    On Keras 3 and TensorFlow the same rule fires for ``model.fit(x, y, shuffle=False)`` (or
    ``shuffle="batch"``, which shuffles whole batches only) on labels stored in class order —
    the batches ``fit`` will draw are read from ``y`` when ``fit`` is called — and for a
    ``tf.data`` pipeline with no ``shuffle`` at all whose training batches (those followed
    by an optimizer step, in ``fit`` or a custom loop) arrive in label order. A pipeline that
    does shuffle, with a buffer too small to mix sorted data, is K107 instead (never both).
    ``fit(validation_split=…)`` on sorted arrays with the default ``shuffle=True`` is not
    D105: the training batches are shuffled; the split itself takes the *last* samples
    before any shuffling, so the validation set holds only the last classes (Keras docs).

    ## Why is this bad?
    SGD then sees one class for many consecutive steps: the model swings toward each class
    in turn, and BatchNorm's running statistics are dominated by the last classes, so the
    model evaluates with statistics of one class.

    ## Example
    ```python
    loader = DataLoader(dataset_sorted_by_class, batch_size=32)          # shuffle=False
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset_sorted_by_class, batch_size=32, shuffle=True)
    ```

    ## References
    - PyTorch docs, `DataLoader` (`shuffle=True` reshuffles every epoch): https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader
    - Bengio, "Practical recommendations for gradient-based training of deep architectures" (2012), on shuffling: https://arxiv.org/abs/1206.5533
    - Keras, ``Model.fit`` (``shuffle``, ``validation_split``): https://keras.io/api/models/model_training_apis/#fit-method
    - tf.data.Dataset.shuffle: https://www.tensorflow.org/api_docs/python/tf/data/Dataset#shuffle
    """

    code = "D105"
    name = "unshuffled-training-data"
    severity = Severity.WARNING
    heuristic = True
    summary = "training batches arrive in label order (each batch dominated by one class)"
    fix = "shuffle the training data: DataLoader(..., shuffle=True) or a random sampler"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._pending: tuple[weakref.ref, tuple[int, float, int], Any] | None = None
        self._orders: dict[int, LabelOrder] = {}
        self._locations: dict[int, Any] = {}
        self._reported: set[int] = set()
        # Per loader (by id): is it read on every batch (labels on the CPU, not settled)? When
        # none is, the batch and backward handlers run on sampled steps only, until a pass over
        # a loader that may be starts (``on_epoch_start``) or a sampled batch shows one.
        self._every_batch: dict[int, tuple[weakref.ref, bool]] = {}

    def _read_every_batch(self, loader: Any, needed: bool) -> None:
        key = id(loader)
        known = self._every_batch.get(key)
        if known is None or known[1] != needed or known[0]() is not loader:
            self._every_batch[key] = (weakref.ref(loader), needed)
        wanted = needed or any(want and ref() is not None for ref, want in self._every_batch.values())
        self.session.every_step(self, wanted, "batch", "backward")

    def on_epoch_start(self, event: EpochStart) -> None:
        loader = event.loader
        if loader is None or id(loader) in self._reported:
            return
        order = self._orders.get(id(loader))
        if order is None or not order.settled:
            self._read_every_batch(loader, True)  # its labels' device is known at its first batch

    def on_batch(self, event: BatchFetched) -> None:
        self._pending = None
        loader = event.loader
        if loader is None:
            return
        order = self._orders.get(id(loader))
        settled = order is not None and order.settled  # shuffled for hundreds of batches
        if id(loader) in self._reported or (settled and not event.sampled):
            self._read_every_batch(loader, False)
            return
        labels = label_tensor(event.batch)
        # Labels still on the CPU (the loader's own output) are read on every batch until the
        # loader is settled (``LabelOrder.settled``): a class block longer than the first window
        # of sampled steps is seen wherever the run stops. Labels already on an accelerator are
        # read on sampled steps only (reading them synchronises).
        on_host = labels is not None and labels.device.type == "cpu"
        self._read_every_batch(loader, on_host and not settled)
        if labels is None or (not on_host and not event.sampled):
            return
        # The user's line is looked up (a walk of the stack) until a training batch of this
        # loader recorded it, not on every batch.
        location = None if id(loader) in self._locations else event.location
        self._pending = (weakref.ref(loader), batch_label_summary(labels), location)

    def on_backward(self, event: Backward) -> None:
        pending, self._pending = self._pending, None
        if pending is None or event.index_since_step != 0:
            return
        loader_ref, summary, location = pending
        loader = loader_ref()
        if loader is None:
            return
        key = id(loader)
        if key in self._reported:
            return
        order = self._orders.get(key)
        if order is None:
            order = self._orders[key] = LabelOrder()
        order.add(summary)
        if key not in self._locations:
            self._locations[key] = location
        found = order.evidence()
        if found is None:
            return
        self._reported.add(key)
        single, distinct = found
        sampler = type(getattr(loader, "sampler", None)).__name__
        self.report(
            f"{single} of {order.usable} training batches from this DataLoader are single-class "
            f"(one label ≥ {DOMINANT_SHARE:.0%} of the batch), dominated by {distinct} different labels in "
            f"turn (sampler: {sampler}; the longest run: {order.longest[1]} consecutive batches of label "
            f"{order.longest[0]}): the training data arrives sorted by class. Shuffled balanced "
            "data gives such batches with probability "
            f"≤ {chance_of_single_class_batch(max(distinct, 2), UNSHUFFLED_MIN_BATCH_SIZE):.1%} each.",
            location=self._locations.get(key),
            evidence={"single_class_batches": single, "batches": order.usable, "dominant_labels": distinct,
                      "sampler": sampler, "longest_run": {"label": order.longest[0], "batches": order.longest[1]},
                      "first_batches": [list(b) for b in order.first],
                      "last_batches": [list(b) for b in order.last]},
            step=event.step,
        )
        del self._orders[key]


@register
class NonfiniteInput(Check):
    """
    ## What it does
    Counts NaN and Inf values in the first tensor given to a model and in the targets
    given to a loss, on sampled steps.

    ## Why is this bad?
    One NaN in an input batch turns the loss into NaN, and a single NaN gradient step
    destroys every weight it touches: from then on the model outputs NaN, long after the
    culprit batch is gone. Exploding weights and NaN losses that come from the input data (an empty batch, a
    broken preprocessing step) can take days to trace back once the batch is gone.

    ## Example
    ```python
    x = (raw - raw.mean(0)) / raw.std(0)      # a constant feature: 0/0 = NaN
    loss = criterion(model(x), y)
    ```

    ## Use instead
    ```python
    x = (raw - raw.mean(0)) / (raw.std(0) + 1e-8)
    assert torch.isfinite(x).all()
    ```

    ## References
    - PyTorch docs, `torch.isfinite`: https://pytorch.org/docs/stable/generated/torch.isfinite.html
    - PyTorch docs, autograd anomaly detection: https://pytorch.org/docs/stable/autograd.html#anomaly-detection
    """

    code = "D106"
    name = "nonfinite-input"
    severity = Severity.ERROR
    summary = "NaN/Inf in input or target batches"
    fix = "find where the data becomes non-finite (division by a zero std, log of 0, corrupt files) and fix or filter it"

    @sampled_only
    def on_forward(self, event: Forward) -> None:
        if not event.sampled:
            return  # _model_input reads sampled steps only
        stats = _model_input(self, event)
        if stats is None or stats.finite:
            return
        self.report(
            f"{stats.nonfinite} of {stats.numel} values of the input to {_model_name(event)} "
            f"{list(stats.shape)} are NaN or Inf.",
            location=event.location,
            evidence={"nonfinite": stats.nonfinite, "numel": stats.numel, "shape": list(stats.shape)},
            step=event.step,
        )

    @sampled_only
    def on_loss(self, event: LossComputed) -> None:
        if not event.sampled or not isinstance(event.target, torch.Tensor) or not event.target.is_floating_point():
            return
        stats = cached_stats(event, "target", event.target)
        if stats is None or stats.finite:
            return
        self.report(
            f"{stats.nonfinite} of {stats.numel} target values given to {event.function} are NaN or Inf.",
            location=event.location,
            evidence={"nonfinite": stats.nonfinite, "numel": stats.numel, "shape": list(stats.shape)},
            step=event.step,
        )


@register
class LabelOutOfRange(Check):
    """
    ## What it does
    Reads class targets before `cross_entropy` / `nll_loss` run (the loss modules call
    them too) and flags targets outside `[0, C)` for a C-way output — labels numbered
    1..C, or negative labels other than `ignore_index` (e.g. -1 for "unlabelled" while
    `ignore_index` is still -100). Also flags targets outside [0, 1] given to
    `binary_cross_entropy(_with_logits)` (masks saved as 0/255).

    ## Why is this bad?
    On CPU the loss raises "Target N is out of bounds"; on CUDA it triggers an
    asynchronous device-side assert reported at some later, unrelated line. BCE does not
    check at all: targets of 255 silently turn the loss into a large linear penalty that
    pushes every logit upward. Match the label format to the loss.

    ## Example
    ```python
    labels = torch.tensor(df["class_id"])          # 1..10
    loss = F.cross_entropy(model(x), labels)       # 10 outputs: indices 0..9
    ```

    ## Use instead
    ```python
    loss = F.cross_entropy(model(x), labels - 1)
    # or F.cross_entropy(logits, target, ignore_index=-1) for unlabelled samples
    ```

    ## References
    - PyTorch docs, `CrossEntropyLoss` (target in [0, C) or ignore_index): https://pytorch.org/docs/stable/generated/torch.nn.CrossEntropyLoss.html
    """

    code = "D107"
    name = "label-out-of-range"
    severity = Severity.ERROR
    summary = "class targets outside [0, C) for a C-way output (e.g. labels 1..C), or negative other than ignore_index"
    fix = "map labels to 0..C-1 (e.g. labels - 1), or pass the marker of unlabelled samples as ignore_index"
    needs = frozenset({"target_ranges"})
    _probe: Any = None  # the session's TargetProbe, once looked up

    def _report_pending(self) -> None:
        probe = self._probe
        if probe is None:  # the session's probe, looked up once (every loss asks)
            probe = self._probe = target_range_records(self.session)
        if probe.pending is None:  # the usual loss: nothing out of range
            return
        record = probe.take()
        if record is None:
            return
        self.report(
            f"{record.out_of_range} of {record.numel} targets given to {record.function} lie outside "
            f"[0, {record.classes}) for a {record.classes}-way output (targets range {record.min}..{record.max}, "
            f"ignore_index={record.ignore_index})"
            + (": labels look numbered 1..C." if record.min >= 1 and record.max == record.classes else "."),
            location=record.location,
            evidence={"classes": record.classes, "min": record.min, "max": record.max,
                      "out_of_range": record.out_of_range, "ignore_index": record.ignore_index},
            step=record.step,
        )

    @sampled_only  # the target-range probe records on sampled steps only, in the loss's own step
    def on_loss(self, event: LossComputed) -> None:
        if not event.sampled:
            return
        self._report_pending()
        if event.function not in ("binary_cross_entropy", "binary_cross_entropy_with_logits"):
            return
        stats = cached_stats(event, "target", event.target)
        if stats is None or not stats.finite or not binary_target_outside_unit(stats.min, stats.max):
            return
        self.report(
            f"targets given to {event.function} range over [{stats.min:.4g}, {stats.max:.4g}]; binary "
            "cross-entropy needs probabilities in [0, 1].",
            location=event.location,
            evidence={"min": stats.min, "max": stats.max, "function": event.function},
            step=event.step,
        )

    def on_crash(self, event: Crash) -> None:
        self._report_pending()


@register
class ConstantInput(Check):
    """
    ## What it does
    On sampled steps, finds samples of a model's floating-point input batch whose values
    are all identical (zero variance), when each sample has at least 64 values (images,
    spectrograms, long feature vectors).

    ## Why is this bad?
    A constant sample carries no information: most often an image that failed to load and
    was replaced by zeros (a `try/except` returning `torch.zeros`), a black frame, or a
    crop that fell entirely into padding. The model trains on it with its label anyway
    (`cv2.imread` silently returns None for a missing file).

    ## Example
    ```python
    def __getitem__(self, i):
        try:
            img = load(self.paths[i])
        except OSError:
            img = torch.zeros(3, 224, 224)       # silent placeholder
    ```

    ## Use instead
    ```python
    def __getitem__(self, i):
        return load(self.paths[i])               # fail loudly, then fix or drop the file
    ```
    `nndoctor data` lists unreadable and blank files (F101, F112) before training.

    ## References
    - OpenCV docs, `cv::imread` returns an empty matrix (None in Python) for a file it cannot read: https://docs.opencv.org/4.x/d4/da8/group__imgcodecs.html
    - PyTorch docs, writing a `Dataset`: https://pytorch.org/tutorials/beginner/data_loading_tutorial.html
    """

    code = "D108"
    name = "constant-input"
    severity = Severity.WARNING
    summary = "a batch or sample with zero variance (images that failed to load became zeros)"
    fix = "find why these samples are constant (failed loads replaced by zeros, black frames) and fix or drop them"

    _MIN_VALUES = 64

    @sampled_only
    @model_forwards_only
    def on_forward(self, event: Forward) -> None:
        if not event.sampled or event.is_loss:
            return
        tensor = model_input_tensor(event.inputs, event.kwargs)
        if tensor is None or not tensor.is_floating_point() or tensor.dim() < 2 or tensor.shape[0] < 1:
            return
        summary = sample_summary(event, "input0", tensor)
        if summary is None or summary.values_per_sample < self._MIN_VALUES:
            return
        constant = [i for i, c in enumerate(summary.constant) if c]
        if not constant:
            return
        seen = len(summary.constant)
        whole = len(constant) == seen
        self.report(
            (f"every sample of the input to {_model_name(event)} {list(tensor.shape)} is constant"
             if whole else
             f"{len(constant)} of {seen} samples of the input to {_model_name(event)} {list(tensor.shape)} "
             f"are constant (zero variance; batch positions {constant[:8]})"),
            location=event.location,
            evidence={"constant_samples": len(constant), "samples": seen, "positions": constant[:16]},
            step=event.step,
        )


@register
class TrainEvalOverlap(Check):
    """
    ## What it does
    On sampled steps, fingerprints each sample given to a model: training samples (forward
    with gradients of a model an optimizer updates) and evaluation samples (forward under
    `no_grad`/`inference_mode`). A fingerprint is a 16-byte hash of 256 evenly spaced
    values rounded to float16 plus the sample's full sum and sum of squares; at most 200 000
    training fingerprints are kept (about 18 MB of host memory, measured). Evaluation samples identical to a seen
    training sample are reported with their count.

    Evaluating on the training data on purpose (train accuracy) is not reported: only
    samples whose evaluation batch came from a different DataLoader than the training
    batches count; without DataLoaders, an evaluation batch must be partly (not entirely)
    made of training samples — a leaky split rather than a deliberate pass over the
    training set. Random augmentation makes training copies differ, so the count is a lower
    bound; training samples of unsampled steps are not seen either.

    ## Why is this bad?
    Validation samples that are also in the training set make validation accuracy measure
    memorisation: model selection, early stopping and the reported number are all
    optimistic. Typical causes: a random split done twice with different seeds, duplicated
    files, `val_set = train_set` left from debugging.

    ## Example
    ```python
    train_idx = torch.randperm(n)[:800]
    val_idx = torch.randperm(n)[:200]             # a second permutation: overlaps train
    ```

    ## Use instead
    ```python
    perm = torch.randperm(n)
    train_idx, val_idx = perm[:800], perm[800:]   # or torch.utils.data.random_split
    ```

    ## References
    - Kaufman et al., "Leakage in data mining", TKDD 2012.
    - `nndoctor data` F110 finds cross-split duplicates on disk.
    """

    code = "D109"
    name = "train-eval-overlap"
    severity = Severity.WARNING
    summary = "identical samples in the training and the evaluation data"
    fix = "split the data once into disjoint train/val sets (random_split or one permutation) and deduplicate files"

    _MAX_TRAIN = 200_000

    def __init__(self, session) -> None:
        super().__init__(session)
        self._train: set[bytes] = set()
        self._train_loaders: set[int] = set()
        self._last_loader: int | None = None
        self._overlap: set[bytes] = set()
        self._eval_seen = 0
        self._location: Location | None = None
        self._first_step: int | None = None

    # Read by the sampled forward that consumes the batch: a batch and its forward share a step.
    @sampled_only
    def on_batch(self, event: BatchFetched) -> None:
        if not event.sampled:
            return
        self._last_loader = id(event.loader) if event.loader is not None else None

    @sampled_only
    @model_forwards_only
    def on_forward(self, event: Forward) -> None:
        if not event.sampled or event.is_loss:
            return
        tensor = model_input_tensor(event.inputs, event.kwargs)
        if tensor is None or not tensor.is_floating_point() or tensor.dim() < 2:
            return
        training = event.grad_enabled and not event.inference_mode
        if training and not self.session.state.is_trained(event.module):
            return
        summary = sample_summary(event, "input0", tensor)
        if summary is None:
            return
        if training:
            if self._last_loader is not None:
                self._train_loaders.add(self._last_loader)
            if len(self._train) < self._MAX_TRAIN:
                self._train.update(summary.fingerprints)
            return
        if not self._train:
            return
        matching = [f for f in summary.fingerprints if f in self._train]
        hits = len(matching)
        if not hits:
            return
        loader = self._last_loader
        if loader is not None and loader in self._train_loaders:
            return  # deliberate evaluation of the training loader
        if loader is None and hits == len(summary.fingerprints):
            return  # a whole batch of training samples: a deliberate pass over the train set
        if len(self._overlap) < self._MAX_TRAIN:
            self._overlap.update(matching)
        self._eval_seen += len(summary.fingerprints)
        if self._location is None:
            self._location, self._first_step = event.location, event.step

    def on_run_end(self, event: RunEnd) -> None:
        if not self._overlap:
            return
        self.report(
            f"{len(self._overlap)} distinct evaluation samples (no_grad forwards; {self._eval_seen} samples in "
            f"the evaluation batches where overlap was found) are identical to training samples seen on sampled steps "
            f"({len(self._train)} training fingerprints kept): the evaluation data leaks into training.",
            location=self._location,
            evidence={"identical_samples": len(self._overlap), "train_fingerprints": len(self._train)},
            step=self._first_step,
        )
