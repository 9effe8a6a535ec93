"""What the NVIDIA driver reports, read independently of any framework.

``nvidia-smi`` ships with the driver, so it is the one source that works whether or not a
framework was built with CUDA; NVML (``nvidia-ml-py``) is used only when ``nvidia-smi`` is
not on ``PATH``. A machine without either simply has no NVIDIA driver as far as we can tell.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

QUERY_TIMEOUT_S = 20.0
_GPU_FIELDS = "index,name,uuid,memory.total,memory.used,utilization.gpu,compute_cap,driver_version"
_APP_FIELDS = "gpu_uuid,pid,used_memory,process_name"


@dataclass
class Gpu:
    index: int
    name: str
    uuid: str = ""
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    utilization_percent: float | None = None
    compute_capability: str | None = None  # "9.0"


@dataclass
class GpuProcess:
    gpu_uuid: str
    pid: int
    used_memory_mib: float | None
    name: str


@dataclass
class DriverInfo:
    """The driver's view: ``present`` is False when no NVIDIA driver tool answered."""

    present: bool = False
    source: str = ""  # "nvidia-smi" or "nvml"
    driver_version: str | None = None
    cuda_version: str | None = None  # the newest CUDA runtime this driver supports, "12.4"
    gpus: list[Gpu] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _run(args: list[str]) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError((done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"])
    return done.stdout


def parse_gpu_rows(text: str) -> tuple[list[Gpu], str | None]:
    """Rows of ``--query-gpu=index,name,uuid,memory.total,memory.used,utilization.gpu,compute_cap,driver_version``."""
    gpus, driver = [], None
    for row in text.strip().splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) < 8 or not cells[0].isdigit():
            continue
        gpus.append(Gpu(index=int(cells[0]), name=cells[1], uuid=cells[2],
                        memory_total_mib=_number(cells[3]), memory_used_mib=_number(cells[4]),
                        utilization_percent=_number(cells[5]),
                        compute_capability=cells[6] if re.fullmatch(r"\d+\.\d+", cells[6]) else None))
        driver = driver or cells[7]
    return gpus, driver


def parse_app_rows(text: str) -> list[GpuProcess]:
    processes = []
    for row in text.strip().splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) < 4 or not cells[1].isdigit():
            continue
        processes.append(GpuProcess(gpu_uuid=cells[0], pid=int(cells[1]),
                                    used_memory_mib=_number(cells[2]), name=",".join(cells[3:])))
    return processes


def parse_cuda_version(text: str) -> str | None:
    """``CUDA Version: 12.4`` from ``nvidia-smi``'s banner (or ``-q``)."""
    found = re.search(r"CUDA Version\s*:\s*(\d+\.\d+)", text)
    return found.group(1) if found else None


def _from_nvidia_smi(tool: str) -> DriverInfo:
    info = DriverInfo(present=True, source="nvidia-smi")
    try:
        info.gpus, info.driver_version = parse_gpu_rows(
            _run([tool, f"--query-gpu={_GPU_FIELDS}", "--format=csv,noheader,nounits"]))
        info.cuda_version = parse_cuda_version(_run([tool]))
        info.processes = parse_app_rows(
            _run([tool, f"--query-compute-apps={_APP_FIELDS}", "--format=csv,noheader,nounits"]))
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
        # A driver tool that fails is itself a finding (driver/kernel module mismatch).
        info.error = f"{' '.join([tool])} failed: {error}"
    return info


def _from_nvml() -> DriverInfo | None:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 - NVMLError subclasses: no driver loaded
        return DriverInfo(present=False, source="nvml", error=str(error))
    try:
        info = DriverInfo(present=True, source="nvml")
        info.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
        version = pynvml.nvmlSystemGetCudaDriverVersion()
        info.cuda_version = f"{version // 1000}.{(version % 1000) // 10}"
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            info.gpus.append(Gpu(index=index, name=_text(pynvml.nvmlDeviceGetName(handle)), uuid=uuid,
                                 memory_total_mib=memory.total / 2**20, memory_used_mib=memory.used / 2**20,
                                 utilization_percent=float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                                 compute_capability=f"{major}.{minor}"))
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(process, "usedGpuMemory", None)
                info.processes.append(GpuProcess(uuid, process.pid, used / 2**20 if used else None, ""))
        return info
    finally:
        pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def query_driver() -> DriverInfo:
    """The driver's version, its CUDA version, the GPUs and the processes using them."""
    tool = shutil.which("nvidia-smi")
    if tool:
        return _from_nvidia_smi(tool)
    return _from_nvml() or DriverInfo(present=False)
