"""Gather every fact ``nndoctor env`` reports: driver, frameworks, packages, shadowing files."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from nndoctor.commands.env.checks import EnvFacts
from nndoctor.commands.env.frameworks import companion_versions, probe_frameworks
from nndoctor.commands.env.nvidia import query_driver
from nndoctor.commands.env.packages import (
    duplicate_installs,
    installed_distributions,
    unmet_requirements,
)
from nndoctor.commands.env.tf_triton import finish_probe, read_versions, start_probe


def collect(*, probe_tf_triton: bool = True) -> EnvFacts:
    """Every fact; ``probe_tf_triton=False`` (V109 not selected) skips the TensorFlow/triton
    crash probe's child process, the versions are still read from the package metadata."""
    distributions = installed_distributions()
    tf_triton = read_versions()
    # The crash probe runs beside the framework probes, and only for a pair that can crash.
    probe = probe_tf_triton and tf_triton.at_risk
    crash_probe = start_probe() if probe else None
    frameworks = probe_frameworks()
    if probe:
        finish_probe(tf_triton, crash_probe)
    return EnvFacts(
        driver=query_driver(),
        frameworks=frameworks,
        tf_triton=tf_triton,
        companions=companion_versions(),
        unmet=unmet_requirements(distributions),
        duplicates=duplicate_installs(distributions),
        environ=dict(os.environ),
        own_pids=frozenset({os.getpid()}),
    )


# Installed modules whose shadowing breaks training scripts (a local utils.py beside an
# installed ``utils`` package is usually intended, so only these are reported).
FRAMEWORK_MODULES = {"torch", "torchvision", "torchaudio", "tensorflow", "keras", "jax", "numpy", "scipy",
                     "transformers", "timm", "lightning", "PIL", "cv2", "sklearn", "pandas", "matplotlib",
                     "tensorboard", "accelerate", "datasets"}


def shadowing_files(directory: str) -> list[dict[str, str]]:
    """Files or packages in ``directory`` named like a standard-library or installed module:
    a script started from here imports them instead of the real module."""
    from importlib.metadata import packages_distributions

    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return []
    installed = packages_distributions()
    found = []
    for entry in entries:
        path = os.path.join(directory, entry)
        name = entry[:-3] if entry.endswith(".py") else entry
        if not name.isidentifier() or name == "__main__":
            continue
        if not (entry.endswith(".py") or os.path.isfile(os.path.join(path, "__init__.py"))):
            continue
        if name in sys.stdlib_module_names and name not in sys.builtin_module_names:
            found.append({"name": name, "path": path, "shadows": "standard library"})
        elif name in FRAMEWORK_MODULES and name in installed:
            found.append({"name": name, "path": path, "shadows": f"installed package {installed[name][0]}"})
    return found


def system_summary() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
    }
