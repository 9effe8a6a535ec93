"""The step-time breakdown: per-step phase times and the pure arithmetic over them.

A *step* is the interval between the end of one ``optimizer.step()`` and the end of the
next, so everything the loop does — waiting for the batch, copying it to the device,
forward, backward, the update, logging, checkpointing — lands in exactly one step.
Phases are timed on the host; what is left once the timed phases are subtracted is
"other host time" (Python bookkeeping, metric code, launches outside a module call).
No torch here: the recorder fills ``StepRecord``s, everything else is arithmetic.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

# Order of the report. ``sync`` is host time blocked in .item()/.cpu()/... outside a phase.
PHASES = ("data", "h2d", "forward", "backward", "optimizer", "io", "sync")
PHASE_LABELS = {
    "data": "data wait (DataLoader)",
    "h2d": "host-to-device copy",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer step",
    "io": "checkpoint / logging I/O",
    "sync": "blocked in host-device syncs",
    "other": "other host time",
}


@dataclass
class StepRecord:
    """Host seconds per phase for one optimizer step, plus its wall time."""

    step: int
    wall: float = 0.0
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    syncs: int = 0
    samples: int = 0
    gpu_busy: float | None = None  # seconds of GPU span (CUDA events), sampled steps only

    @property
    def other(self) -> float:
        return max(0.0, self.wall - sum(self.phases.values()))


@dataclass
class Breakdown:
    """Totals over the measured window."""

    steps: int
    wall: float
    phases: dict[str, float]
    syncs: int
    samples: int
    step_times: list[float]
    gpu_busy: float | None
    gpu_wall: float | None  # host wall of the steps that carry a GPU measurement

    def fraction(self, phase: str) -> float:
        return self.phases.get(phase, 0.0) / self.wall if self.wall > 0 else 0.0

    @property
    def median_step(self) -> float:
        return statistics.median(self.step_times) if self.step_times else 0.0

    @property
    def samples_per_s(self) -> float | None:
        return self.samples / self.wall if self.samples and self.wall > 0 else None

    @property
    def syncs_per_step(self) -> float:
        return self.syncs / self.steps if self.steps else 0.0

    @property
    def gpu_busy_fraction(self) -> float | None:
        if self.gpu_busy is None or not self.gpu_wall:
            return None
        return min(1.0, self.gpu_busy / self.gpu_wall)

    def to_json(self) -> dict:
        return {
            "steps": self.steps,
            "wall_s": self.wall,
            "median_step_s": self.median_step,
            "samples_per_s": self.samples_per_s,
            "phases_s": dict(self.phases),
            "fractions": {k: self.fraction(k) for k in self.phases},
            "syncs_per_step": self.syncs_per_step,
            "gpu_busy_fraction": self.gpu_busy_fraction,
        }


def summarize(records: list[StepRecord]) -> Breakdown:
    """Add up the measured steps (phases, 'other', GPU span over the steps that have one)."""
    phases = dict.fromkeys((*PHASES, "other"), 0.0)
    for record in records:
        for name, seconds in record.phases.items():
            phases[name] += seconds
        phases["other"] += record.other
    gpu_steps = [(r.gpu_busy, r.wall) for r in records if r.gpu_busy is not None]
    return Breakdown(
        steps=len(records),
        wall=sum(r.wall for r in records),
        phases=phases,
        syncs=sum(r.syncs for r in records),
        samples=sum(r.samples for r in records),
        step_times=[r.wall for r in records],
        gpu_busy=sum(busy for busy, _ in gpu_steps) if gpu_steps else None,
        gpu_wall=sum(wall for _, wall in gpu_steps) if gpu_steps else None,
    )


def amdahl_speedup(fraction_removed: float) -> float:
    """Upper bound on the speed-up when a fraction of the step time disappears entirely."""
    fraction_removed = min(max(fraction_removed, 0.0), 0.999)
    return 1.0 / (1.0 - fraction_removed)


def relative_noise(times: list[float]) -> float:
    """Spread of repeated timings of one variant: (max - min) / median (0 for one sample).
    From 5 samples on, the fastest and the slowest are left out first: one run disturbed by
    something else on the machine must not hide a difference the other runs agree on."""
    if len(times) < 2:
        return 0.0
    middle = statistics.median(times)
    kept = sorted(times)[1:-1] if len(times) >= 5 else times
    return (max(kept) - min(kept)) / middle if middle > 0 else 0.0


def speedup_verdict(base: list[float], variant: list[float], *, floor: float = 0.03) -> dict:
    """Compare interleaved repeat timings (seconds per step) of the baseline and a variant.

    The change *pays off* when its median speed-up exceeds both ``floor`` and the larger
    of the two variants' own repeat spreads: a difference smaller than the noise of timing
    the same thing twice is not evidence.
    """
    base_median, variant_median = statistics.median(base), statistics.median(variant)
    speedup = base_median / variant_median if variant_median > 0 else float("inf")
    noise = max(relative_noise(base), relative_noise(variant))
    return {
        "speedup": speedup,
        "noise": noise,
        "pays_off": speedup - 1.0 > max(floor, noise),
        "base_s": base_median,
        "variant_s": variant_median,
    }
