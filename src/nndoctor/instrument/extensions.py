"""Extra instrumentation installers contributed by feature packages (crash context, perf timers).

Each installer is ``fn(installation) -> None`` and must register its undo actions on
``installation.patcher`` so ``uninstall()`` restores everything. Features append to
``INSTALLERS`` at import time of this module only — never patch torch on import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

INSTALLERS: list[Callable[[Any], None]] = []


def _load_feature_installers() -> None:
    # Listed explicitly (not discovered) so the set of patches is easy to audit.
    import importlib

    for module_name in ("nndoctor.explain.instrument", "nndoctor.perf.instrument"):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and module_name.startswith(error.name):
                continue
            raise
        installer = getattr(module, "install", None)
        if installer is not None and installer not in INSTALLERS:
            INSTALLERS.append(installer)


_load_feature_installers()
