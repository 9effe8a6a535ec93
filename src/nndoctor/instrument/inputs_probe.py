"""Statistics on inputs and targets for the D and L checks, computed once and shared.

Two jobs:

* ``install`` wraps ``F.cross_entropy`` and ``F.nll_loss`` (the loss modules call them too)
  to read the class-target range *before* the loss runs, on sampled steps. After the call
  it is too late: on CPU an out-of-range target raises inside the loss, on CUDA it queues
  a device-side assert that the next synchronisation (ours included) would raise. The
  record is kept in the session's stash (``target_range_records``) for D107 to report.
* Per-sample summaries of a batch (``sample_summary``): which samples are constant (D108)
  and a cheap fingerprint of each sample (D109), computed once per event and cached on it.

Everything here runs on sampled steps only and reads tensors without changing them.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from nndoctor.core.findings import Location
from nndoctor.core.stash import StashKey
from nndoctor.core.user_code import user_location
from nndoctor.instrument.stats import has_plain_values

if TYPE_CHECKING:
    from nndoctor.instrument.torch_hooks import Installation

# Positional index of ``ignore_index`` after (input, target) in both signatures:
# cross_entropy(input, target, weight, size_average, ignore_index, ...), same for nll_loss.
_IGNORE_INDEX_POSITION = 2
_PROBED_LOSSES = ("cross_entropy", "nll_loss")
# Bounded per-sample work: at most this many samples and values per sample are read.
MAX_SAMPLES = 256
FINGERPRINT_VALUES = 256


@dataclass(frozen=True)
class TargetRange:
    """Class targets of one loss call that fall outside [0, classes) (ignore_index aside)."""

    function: str
    classes: int
    min: int
    max: int
    out_of_range: int
    numel: int
    ignore_index: int
    step: int
    location: Location | None


class TargetProbe:
    """The latest out-of-range record of one session (plain numbers, no tensors)."""

    def __init__(self) -> None:
        self.pending: TargetRange | None = None

    def take(self) -> TargetRange | None:
        record, self.pending = self.pending, None
        return record


TARGET_RANGES = StashKey[TargetProbe]("out-of-range class targets")


def target_range_records(session: Any) -> TargetProbe:
    """The session's probe (created on first use so checks work without the patch too)."""
    return session.stash.get_or_create(TARGET_RANGES, TargetProbe)


def class_target_range(input: Any, target: Any, ignore_index: int) -> tuple[int, int, int, int, int] | None:
    """(classes, min, max, out_of_range, numel) of integer class targets, or None.

    min/max exclude ``ignore_index``. One host synchronisation.
    """
    if not has_plain_values(input) or not has_plain_values(target):
        return None
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        return None
    if target.numel() == 0 or input.dim() == 0:
        return None
    classes = int(input.shape[1] if input.dim() >= 2 else input.shape[0])
    with torch.no_grad():
        t = target.detach().reshape(-1).to(torch.int64)
        ignored = t == ignore_index
        big = torch.iinfo(torch.int64).max
        lo = torch.where(ignored, torch.full_like(t, big), t).min()
        hi = torch.where(ignored, torch.full_like(t, -big), t).max()
        bad = (((t < 0) | (t >= classes)) & ~ignored).sum()
        lo_v, hi_v, bad_v = torch.stack([lo, hi, bad]).cpu().tolist()
    if lo_v == big:  # every target ignored
        return None
    return classes, int(lo_v), int(hi_v), int(bad_v), int(t.numel())


def install(installation: Installation) -> None:
    # Installed only when a check needs "target_ranges" (D107): otherwise the loss functions
    # stay untouched (instrument/extensions.py).
    probe = target_range_records(installation.session)
    for name in _PROBED_LOSSES:
        current = getattr(F, name, None)
        if current is None:
            continue
        installation.patcher.patch(F, name, _make_probe(installation, probe, name, current))


def _make_probe(installation: Installation, probe: TargetProbe, name: str, wrapped: Any) -> Any:
    session = installation.session

    def record(input: Any, target: Any, args: tuple, kwargs: dict, frame: Any) -> None:
        ignore = kwargs.get("ignore_index", args[_IGNORE_INDEX_POSITION] if len(args) > _IGNORE_INDEX_POSITION else -100)
        found = class_target_range(input, target, int(ignore))
        if found is None:
            return
        classes, lo, hi, bad, numel = found
        if bad:
            probe.pending = TargetRange(name, classes, lo, hi, bad, numel, int(ignore), session.step,
                                        user_location(frame))

    @functools.wraps(wrapped)
    def probed(input, target, *args, **kwargs):
        step = session.step  # ``session.sampled`` inlined (every loss)
        if session.active and (step < session.full_window or step % session.sample_every == 0 or session._phase_sampled) \
                and not torch.compiler.is_compiling():
            installation._safe(record, input, target, args, kwargs, sys._getframe(1))
        return wrapped(input, target, *args, **kwargs)

    return probed


# -- per-sample summaries ----------------------------------------------------------------

@dataclass(frozen=True)
class SampleSummary:
    """Per-sample facts about the first ``len(constant)`` samples of a batch."""

    constant: tuple[bool, ...]  # the sample has a single value (zero variance)
    fingerprints: tuple[bytes, ...]  # 16-byte digest of a strided view + exact row sums
    values_per_sample: int


def summarize_samples(tensor: torch.Tensor) -> SampleSummary | None:
    """One pass over a batch (N, ...): constant samples and sample fingerprints.

    The fingerprint hashes up to ``FINGERPRINT_VALUES`` evenly spaced values of the sample
    (rounded to float16) together with its sum and sum of squares over *all* values, so two
    different images rarely collide even when the strided positions fall on a shared
    background. One host synchronisation.
    """
    if not has_plain_values(tensor) or tensor.dim() < 2 or tensor.numel() == 0:
        return None
    if not tensor.is_floating_point():
        return None
    with torch.no_grad(), torch.autocast(tensor.device.type, enabled=False):
        x = tensor.detach()[:MAX_SAMPLES]
        flat = x.reshape(x.shape[0], -1).float()
        width = flat.shape[1]
        count = min(width, FINGERPRINT_VALUES)
        index = torch.linspace(0, width - 1, count, device=flat.device).long()
        picked = flat.index_select(1, index)
        lo, hi = flat.aminmax(dim=1)
        sums = torch.stack([flat.double().sum(1), (flat.double() ** 2).sum(1)], dim=1)
        host = torch.cat([picked, (hi - lo).unsqueeze(1), sums.float()], dim=1).cpu()
    import numpy as np

    values = host.numpy()
    constant = tuple((values[:, count] == 0).tolist())
    # Converted and listed for the whole batch at once: formatting NumPy scalars row by row cost
    # ~7 µs a sample (the same bytes: a float32 lists as the exact Python float it formats as).
    with np.errstate(over="ignore"):  # values beyond float16 hash as ±inf; no warning on the user's stderr
        halves = values[:, :count].astype(np.float16)
    sums = values[:, count + 1:count + 3].tolist()
    # Sums rounded to 6 significant digits: identical samples must match even when the
    # reduction order differs between two batches.
    prints = tuple(
        hashlib.blake2b(half.tobytes() + f"{total:.6g},{squares:.6g}".encode(), digest_size=16).digest()
        for half, (total, squares) in zip(halves, sums, strict=True)
    )
    return SampleSummary(constant=constant, fingerprints=prints, values_per_sample=width)


def sample_summary(event: Any, key: str, tensor: torch.Tensor | None) -> SampleSummary | None:
    """``summarize_samples`` once per event and key (shared by D108 and D109)."""
    if tensor is None:
        return None
    cache = event.cache
    key = f"samples:{key}"
    if key not in cache:
        cache[key] = summarize_samples(tensor)
    return cache[key]


# -- class-axis summaries of loss inputs (L101, L103) ------------------------------------

@dataclass(frozen=True)
class ClassAxisSummary:
    """How a loss input (N, C, ...) behaves along its class axis."""

    min: float
    max: float
    sum_deviation: float  # max over rows of |sum over classes - 1|
    logsumexp_deviation: float  # max over rows of |logsumexp over classes|
    classes: int


def summarize_class_axis(tensor: torch.Tensor) -> ClassAxisSummary | None:
    """Row sums and log-sum-exps along the class axis (dim 1, or 0 for one sample). One sync."""
    if not has_plain_values(tensor) or not tensor.is_floating_point() or tensor.numel() == 0:
        return None
    if tensor.dim() == 0:
        return None
    dim = 1 if tensor.dim() >= 2 else 0
    classes = int(tensor.shape[dim])
    if classes < 2:
        return None
    with torch.no_grad(), torch.autocast(tensor.device.type, enabled=False):
        x = tensor.detach().float()
        values = torch.stack([
            x.amin(), x.amax(), (x.sum(dim) - 1).abs().amax(), torch.logsumexp(x, dim).abs().amax(),
        ]).cpu().tolist()
    low, high, sum_deviation, logsumexp_deviation = (float(v) for v in values)
    return ClassAxisSummary(low, high, sum_deviation, logsumexp_deviation, classes=classes)


def class_axis_summary(event: Any, key: str, tensor: torch.Tensor | None) -> ClassAxisSummary | None:
    if tensor is None:
        return None
    cache = event.cache
    key = f"class_axis:{key}"
    if key not in cache:
        cache[key] = summarize_class_axis(tensor)
    return cache[key]
