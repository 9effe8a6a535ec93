"""The facts part of ``nndoctor env``'s terminal output (the findings use the shared reporter)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from nndoctor.commands.env.checks import EnvFacts
from nndoctor.report.terminal import escape


def _gib(mib: float | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f}"


def cudnn_text(version: int | None) -> str | None:
    """torch reports cuDNN as one integer: 8902 is 8.9.2 (major*1000), 90100 is 9.1.0 (major*10000)."""
    if not version:
        return None
    if version >= 90000:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


def _framework_line(name: str, facts: EnvFacts) -> str:
    framework = facts.frameworks[name]
    if not framework.installed:
        return f"{name}: not installed"
    if not framework.importable:
        return f"{name}: installed, fails to import — {framework.import_error}"
    details = framework.facts
    if name == "torch":
        cuda = details.get("cuda_build")
        cudnn = cudnn_text(details.get("cudnn"))
        build = (f"CUDA {cuda}" + (f", cuDNN {cudnn}" if cudnn else "") + (f", NCCL {details['nccl']}" if details.get("nccl") else "")
                 if cuda else ("ROCm " + details["hip_build"] if details.get("hip_build") else "CPU-only build"))
        archs = details.get("arch_list") or []
        arch_text = f"; kernels for {archs[0]} … {archs[-1]}" if archs else ""
        return f"torch {framework.version}: {build}; sees {details.get('device_count', 0)} GPU(s){arch_text}"
    if name == "tensorflow":
        cuda = details.get("cuda_build")
        return (f"tensorflow {framework.version}: " + (f"CUDA {cuda}, cuDNN {details.get('cudnn_build')}" if cuda else "CPU-only build")
                + f"; sees {len(details.get('gpus') or [])} GPU(s)")
    if name == "keras":
        return f"keras {framework.version}: backend {details.get('backend')}"
    if name == "jax":
        return f"jax {framework.version}: devices {', '.join(details.get('devices') or [])}"
    return f"{name} {framework.version}"


def print_facts(console: Console, facts: EnvFacts, system: dict[str, Any], shadowing: list[dict[str, str]]) -> None:
    line = console.print
    line(f"[bold]nndoctor env[/bold] · Python {system['python']} ({escape(system['executable'])}) · {escape(system['platform'])}")
    driver = facts.driver
    if not driver.present:
        line("NVIDIA driver: none found (no nvidia-smi on PATH, no NVML)")
    else:
        line(f"NVIDIA driver {driver.driver_version or '?'} (supports CUDA {driver.cuda_version or '?'}), "
             f"{len(driver.gpus)} GPU(s), read with {driver.source}" + (f" — {escape(driver.error)}" if driver.error else ""))
        for gpu in driver.gpus:
            line(f"  GPU {gpu.index}  {escape(gpu.name)}  compute {gpu.compute_capability or '?'}  memory "
                 f"{_gib(gpu.memory_used_mib)}/{_gib(gpu.memory_total_mib)} GiB  utilization {gpu.utilization_percent or 0:.0f}%")
        if driver.processes:
            line(f"  {len(driver.processes)} process(es) on the GPUs: " + ", ".join(
                f"pid {p.pid} {escape(p.name)}" for p in driver.processes[:8]))
    line("[bold]frameworks[/bold]")
    for name in facts.frameworks:
        line("  " + escape(_framework_line(name, facts)))
    companions = [f"{name} {version}" for name, version in facts.companions.items() if version]
    if companions:
        line("  also: " + ", ".join(companions))
    line(f"packages: {len(facts.unmet)} unmet requirement(s), "
         f"{len(facts.duplicates)} distribution(s) installed more than once")
    if shadowing:
        line("working directory: " + ", ".join(f"{escape(s['path'])} shadows the {escape(s['shadows'])} module {s['name']}"
                                             for s in shadowing))
    else:
        line("working directory: no file shadows a standard or framework module")
    line("")


def facts_json(facts: EnvFacts, system: dict[str, Any], shadowing: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "system": system,
        "driver": facts.driver.to_json(),
        "frameworks": {name: f.to_json() for name, f in facts.frameworks.items()},
        "companions": facts.companions,
        "unmet_requirements": [u.__dict__ for u in facts.unmet],
        "duplicate_installs": [{"name": d.name, "locations": list(d.locations)} for d in facts.duplicates],
        "shadowing": shadowing,
        "cuda_visible_devices": facts.environ.get("CUDA_VISIBLE_DEVICES"),
        "tensorflow_triton": facts.tf_triton.to_json(),
    }
