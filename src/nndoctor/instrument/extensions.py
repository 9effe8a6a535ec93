"""Extra instrumentation installers contributed by feature packages (crash context, perf timers).

Each installer is ``fn(installation) -> None`` and must register its undo actions on
``installation.patcher`` so ``uninstall()`` restores everything. Features append to
``INSTALLERS`` at import time of this module only — never patch torch on import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

INSTALLERS: list[Callable[[Any], None]] = []


FEATURE_MODULES = (
    "nndoctor.instrument.inputs_probe",  # input/loss statistics (D/L checks)
    "nndoctor.instrument.numerics_probe",  # gradients, activations, seeds (O/N/B/R checks)
    "nndoctor.explain.instrument",  # crash context: failing batch indices (E checks)
    "nndoctor.perf.instrument",  # step-time breakdown (P checks)
    "nndoctor.instrument.warning_relay",  # torch's warnings shown at the user's line, not ours
    "nndoctor.instrument.manual_steps",  # steps of loops that update parameters without torch.optim
    "nndoctor.instrument.loss_sum",  # DataParallel gathers and summed losses (X106), inside ddp_hooks' wrappers
    "nndoctor.instrument.ddp_hooks",  # DDP wrappers and collectives (X checks, stall watchdog)
    "nndoctor.distributed.children",  # mp.spawn / mp.Process trainers report back to the parent
    "nndoctor.watchdog",  # R104/X110: the stall watchdog thread
    "nndoctor.instrument.training_probe",  # clipping, GradScaler steps, checkpointing, anomaly mode
    "nndoctor.instrument.dropout_probe",  # F.dropout without training=self.training (M110)
    "nndoctor.instrument.warning_relay",
    "nndoctor.keras.instrument",  # Keras 3 fit/evaluate (K checks); patches only if keras is imported  # torch's warnings shown at the user's line, not ours
)


def _load_feature_installers() -> None:
    # Listed explicitly (not discovered) so the set of patches is easy to audit.
    import importlib

    for module_name in FEATURE_MODULES:
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
