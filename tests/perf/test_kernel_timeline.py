"""The kernel-timeline classifier (issue 16): busy time from the union of kernel intervals,
idle time split into waiting for data and host overhead, on synthetic and recorded timelines."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from nndoctor.commands.perf.classify import classify_step
from nndoctor.commands.perf.torch.kernel_timeline import KernelProfiler, idle_breakdown, merge


def test_overlapping_kernels_count_once():
    assert merge([(0, 2), (1, 3), (5, 6), (6, 7)]) == [(0, 3), (5, 7)]


def test_launch_bound_timeline_short_kernels_with_gaps():
    # 10 ms steps, 40 kernels of 50 µs each, launched every 250 µs: busy 20%.
    steps = [(i * 0.010, (i + 1) * 0.010) for i in range(3)]
    kernels = [(t * 250e-6, t * 250e-6 + 50e-6) for t in range(120)]
    result = idle_breakdown(steps, kernels, data_waits=[])
    assert abs(result["busy_fraction"] - 0.2) < 1e-9
    assert abs(result["host_idle_fraction"] - 0.8) < 1e-9 and result["data_idle_fraction"] == 0
    decided = classify_step(0.0, 0.95, True, kernel=result)  # CUDA events said 95%: an upper bound
    assert decided["class"] == "launch-bound" and decided["measure"] == "kernel timeline"


def test_gpu_bound_timeline():
    steps = [(0.0, 0.010)]
    kernels = [(0.0002, 0.005), (0.0049, 0.0099)]  # overlap on two streams
    result = idle_breakdown(steps, kernels, [])
    assert abs(result["busy_fraction"] - 0.97) < 1e-9
    assert classify_step(0.0, 0.99, True, kernel=result)["class"] == "gpu-bound"


def test_idle_time_while_waiting_for_data_is_split_out():
    steps = [(0.0, 0.010)]
    kernels = [(0.006, 0.010)]
    waits = [(0.0, 0.004)]  # the loader's __next__; kernels start 2 ms after the batch arrived
    result = idle_breakdown(steps, kernels, waits)
    assert abs(result["data_idle_fraction"] - 0.4) < 1e-9
    assert abs(result["host_idle_fraction"] - 0.2) < 1e-9
    assert abs(result["busy_fraction"] - 0.4) < 1e-9


def test_no_steps_no_breakdown():
    assert idle_breakdown([], [(0, 1)], []) is None
    assert classify_step(0.0, 0.7, True, kernel=None)["class"] == "mixed"


def test_recorded_cpu_profile_gives_step_intervals_and_loader_waits():
    loader = DataLoader(TensorDataset(torch.randn(64, 16)), batch_size=8)
    weight = torch.randn(16, 16)
    profiler = KernelProfiler(steps=2)
    profiler.start()
    done = False
    for (x,) in loader:
        (x @ weight).sum()
        if profiler.step_ended():
            done = True
            break
    assert done and profiler.result is not None
    assert profiler.result["steps"] == 2 and profiler.result["kernels"] == 0  # no GPU: nothing runs there
    assert profiler.result["busy_fraction"] == 0.0
    assert profiler.result["data_idle_fraction"] > 0  # the loader's __next__ is on the timeline


def test_timeline_intervals_reads_the_step_marks():
    profiler = KernelProfiler(steps=3)
    profiler.start()
    while not profiler.step_ended():
        torch.randn(8, 8).sum()
    assert profiler.result["steps"] == 3 and profiler.profiler is None
