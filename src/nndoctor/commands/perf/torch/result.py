"""A measured PyTorch window (``TorchPerfResult``) and the device it ran on."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from nndoctor.commands.perf.backend import Diagnosis
from nndoctor.commands.perf.classify import classify_step
from nndoctor.commands.perf.config import PerfConfig
from nndoctor.commands.perf.timeline import Breakdown
from nndoctor.commands.perf.torch.recorder import LoopFacts


@dataclass
class DeviceInfo:
    name: str = "cpu"
    cuda: bool = False
    capability: tuple[int, int] | None = None
    other_processes: list[dict[str, Any]] = field(default_factory=list)
    nvml: str = "not used"

    @property
    def tensor_cores(self) -> bool:
        return bool(self.capability and self.capability >= (7, 0))


@dataclass
class TorchPerfResult:
    """A measured PyTorch window: the phase breakdown, what the recorder learned about the loop,
    the device and the ``--try`` results."""

    config: PerfConfig
    breakdown: Breakdown
    facts: LoopFacts
    device: DeviceInfo
    trials: dict[str, Any]
    steps_run: int

    def to_json(self) -> dict[str, Any]:
        facts = self.facts
        return {
            "window": {"warmup": self.config.warmup, "steps": self.config.steps, "measured": self.breakdown.steps},
            "breakdown": self.breakdown.to_json(),
            "device": {"name": self.device.name, "capability": self.device.capability,
                       "other_processes": self.device.other_processes, "nvml": self.device.nvml},
            "peak_memory_bytes": facts.peak_memory_bytes,
            "kernel_timeline": facts.kernel_timeline,
            "loader": facts.loader_config,
            "syncs": {"by_kind": facts.sync_kinds,
                      "by_location": {str(k): v for k, v in facts.sync_locations.items()}},
            "trials": self.trials,
            **({"ddp": facts.ddp, "communication": facts.communication,
                "backwards_per_step": facts.backwards_per_step} if facts.ddp else {}),
        }

    def diagnose(self) -> Diagnosis:
        from nndoctor.commands.perf.torch.diagnosis import (  # imports the PyTorch checks
            advice,
            diagnose,
        )

        measured = diagnose(self)
        # The measured P102 replaces the run-time estimate.
        replaces = frozenset({"P102"}) if any(f.code == "P102" for f in measured) else frozenset()
        step_class = classify_step(self.breakdown.fraction("data"), self.breakdown.gpu_busy_fraction,
                                   self.device.cuda, kernel=self.facts.kernel_timeline)
        return Diagnosis(measured, step_class, advice(self), replaces)


def device_info(facts: LoopFacts) -> DeviceInfo:
    info = DeviceInfo()
    if facts.device != "cuda":
        return info
    import torch

    info.cuda = True
    index = torch.cuda.current_device()
    info.name = torch.cuda.get_device_name(index)
    major, minor = torch.cuda.get_device_capability(index)
    info.capability = (major, minor)
    info.other_processes, info.nvml = gpu_processes(index)
    return info


def gpu_processes(index: int) -> tuple[list[dict[str, Any]], str]:
    """Other compute processes on our GPU, through NVML (nvidia-ml-py), if it is there."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            processes = [{"pid": p.pid, "used_memory_bytes": p.usedGpuMemory}
                         for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        finally:
            pynvml.nvmlShutdown()
    except Exception as error:  # noqa: BLE001 - NVML missing in the container, no permission…
        return [], f"NVML unavailable: {type(error).__name__}"
    return other_gpu_processes(processes, os.getpid()), "ok"


def other_gpu_processes(processes: list[dict[str, Any]], own_pid: int) -> list[dict[str, Any]]:
    """The processes that are not us. In a container NVML reports host PIDs, so when our
    PID is absent one process (ours: this run holds a CUDA context) is set aside."""
    others = [p for p in processes if p["pid"] != own_pid]
    if len(others) == len(processes) and others:
        others = sorted(others, key=lambda p: p.get("used_memory_bytes") or 0)[:-1]
    return others
