"""The perf checks' thresholds and detection math: pure functions over measured numbers.

Shared by the run-scope checks (``run_checks``) and by ``diagnosis``, which derives the
perf-scope findings from a finished ``TorchPerfResult``; tests call them directly.
"""

from __future__ import annotations

from typing import Any

from nndoctor.core.findings import Severity

DATA_BOUND_FRACTION = 0.20  # P101/P102: catalog threshold
MIN_MEAN_WAIT_S = 0.002  # P102 under `run`: below 2 ms a batch, worker processes cost more than they save
MIN_STEPS = 5
SYNCS_PER_STEP = 1.0  # P103
SYNC_WARNING_FRACTION = 0.05
LOW_GPU_BUSY = 0.5  # P109: catalog threshold
TENSOR_CORE_CAPABILITY = (7, 0)


def data_bound(wait_s: float, wall_s: float, *, threshold: float = DATA_BOUND_FRACTION) -> dict | None:
    """The data-wait fraction and its Amdahl bound, when the fraction passes ``threshold``."""
    if wall_s <= 0:
        return None
    fraction = wait_s / wall_s
    if fraction < threshold:
        return None
    return {"data_wait_fraction": round(fraction, 4), "data_wait_s": round(wait_s, 4),
            "wall_s": round(wall_s, 4), "max_speedup": round(1.0 / max(1e-3, 1.0 - fraction), 2)}


def loader_costs_time(num_workers: int, wait_s: float, wall_s: float, batches: int, steps: int) -> dict | None:
    """P102 under ``run``: a single-process loader whose waiting is a large, real cost."""
    if num_workers != 0 or steps < MIN_STEPS or batches == 0:
        return None
    found = data_bound(wait_s, wall_s)
    if found is None or wait_s / batches < MIN_MEAN_WAIT_S:
        return None
    return {**found, "mean_wait_ms": round(1000 * wait_s / batches, 2), "batches": batches}


def sync_overlap_bound(phases: dict[str, float], wall: float) -> float:
    """Fraction of the step a removed sync could hide: the host's own work (data, copies,
    Python) that could then run while the GPU computes, capped by the time spent blocked."""
    if wall <= 0:
        return 0.0
    host_work = phases.get("data", 0) + phases.get("h2d", 0) + phases.get("other", 0) + phases.get("io", 0)
    return min(phases.get("sync", 0.0), host_work) / wall


def frequent_syncs(syncs_per_step: float, *, threshold: float = SYNCS_PER_STEP) -> bool:
    return syncs_per_step >= threshold


def low_gpu_busy(busy_fraction: float | None, *, threshold: float = LOW_GPU_BUSY) -> bool:
    return busy_fraction is not None and busy_fraction < threshold


def fp32_on_tensor_cores(device: str, capability: tuple[int, int] | None, param_dtype: str, autocast: bool) -> bool:
    return (device == "cuda" and capability is not None and tuple(capability) >= TENSOR_CORE_CAPABILITY
            and param_dtype == "float32" and not autocast)


def nchw_conv_on_gpu(device: str, has_conv: bool, channels_last: bool | None) -> bool:
    return device == "cuda" and has_conv and channels_last is False


def fixed_shapes_without_benchmark(device: str, has_conv: bool, shapes: set, benchmark: bool) -> bool:
    return device == "cuda" and has_conv and len(shapes) == 1 and not benchmark


def dataparallel_severity(device_ids: list | None) -> Severity:
    """Over several GPUs DataParallel costs real time; on one (or none) it is only advice."""
    return Severity.WARNING if device_ids and len(device_ids) > 1 else Severity.INFO


def trial_outcome(trials: dict[str, Any], name: str) -> dict | None:
    """The --try measurement of ``name`` if it ran (None: not measured)."""
    result = trials.get(name)
    if not isinstance(result, dict) or "speedup" not in result:
        return None
    return result
