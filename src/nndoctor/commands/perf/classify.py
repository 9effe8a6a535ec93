"""Which resource bounds the step — input, host (kernel launches) or the GPU — from the
breakdown: the idle-time reading of Meta's Holistic Trace Analysis ("idle time breakdown":
waiting for data, host overhead between kernels, kernels running), reduced to the fractions
nndoctor measures. The class decides which advice leads."""

from __future__ import annotations

from typing import Any

INPUT_BOUND = 0.20  # data wait share of the step (P101's threshold)
GPU_BOUND = 0.80  # GPU busy share above which the host keeps the GPU fed
LAUNCH_BOUND = 0.50  # below this, with no data wait, the host is the bottleneck

# The changes that can help each class, in the order to try them.
ADVICE_ORDER = {
    "input-bound": ("loader", "parallel-map", "prefetch"),
    # Keras/TensorFlow (perf/tf/diagnosis.py): the step is either fed in time or not.
    "compute-bound": ("mixed-precision", "parallel-map", "prefetch"),
    "launch-bound": ("cuda-graphs", "batch-size", "compile", "fused-optimizer", "fewer-syncs", "amp"),
    "gpu-bound": ("amp", "sdpa", "compile", "channels_last", "tf32", "fused-optimizer", "cudnn-benchmark",
                  "batch-size"),
    "cpu": ("loader", "compile", "sdpa", "amp", "fused-optimizer", "batch-size", "channels_last"),
    "mixed": ("loader", "amp", "sdpa", "compile", "channels_last", "fewer-syncs", "cuda-graphs", "batch-size"),
}


def classify_step(data_fraction: float, gpu_busy: float | None, cuda: bool,
                  kernel: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"class": ..., "reason": ...}`` for one measured window.

    ``gpu_busy`` comes from CUDA events around the step (an upper bound: gaps between kernels
    count as busy); ``kernel``, the profiler's kernel timeline (``kernel_timeline.idle_breakdown``),
    is preferred where it was measured: the union of the kernels' own intervals."""
    if kernel and kernel.get("busy_fraction") is not None and cuda:
        decided = classify_step(data_fraction, kernel["busy_fraction"], cuda)
        decided["measure"] = "kernel timeline"
        decided["reason"] += (f" (kernel timeline: GPU idle {kernel['host_idle_fraction']:.0%} of the step while "
                              f"the host launches or works, {kernel['data_idle_fraction']:.0%} while it waits for data)")
        return decided
    if data_fraction >= INPUT_BOUND:
        return {"class": "input-bound",
                "reason": f"the loop waits for data {data_fraction:.0%} of the step: loader settings first"}
    if not cuda or gpu_busy is None:
        return {"class": "cpu", "reason": "no CUDA timing: the step runs on the CPU"}
    if gpu_busy >= GPU_BOUND:
        return {"class": "gpu-bound",
                "reason": f"the GPU is busy {gpu_busy:.0%} of the step: make the kernels cheaper "
                          "(mixed precision, compilation, memory format, TF32, fused optimizers)"}
    if gpu_busy < LAUNCH_BOUND:
        return {"class": "launch-bound",
                "reason": f"the GPU is busy only {gpu_busy:.0%} of the step while data arrives in time: the host "
                          "cannot launch kernels fast enough (CUDA graphs: --try cuda-graphs; larger batches: --try "
                          "batch-size; fused optimizers, fewer syncs)"}
    return {"class": "mixed", "reason": f"the GPU is busy {gpu_busy:.0%} of the step"}


def order_advice(items: list[dict[str, Any]], step_class: str) -> list[dict[str, Any]]:
    """Advice items with the ones that fit the step's class first (stable otherwise)."""
    order = ADVICE_ORDER.get(step_class, ())
    rank = {name: i for i, name in enumerate(order)}
    return sorted(items, key=lambda item: rank.get(item.get("change", ""), len(order)))
