"""The instrumentation installed besides torch_hooks' core hooks, and when each piece is installed.

Each installer is ``fn(installation) -> None`` and must register its undo actions on
``installation.patcher`` so ``uninstall()`` restores everything. Never patch torch on import:
a module here is imported when its installer is first needed.

Every entry of ``INSTALLERS`` says when it is installed:

- ``needed=True``: only when an enabled check lists the entry's name in its ``needs``
  (the names are the probes of ``nndoctor.probes``);
- ``events=(...)``: only when some check or listener subscribes to one of those event kinds
  (the patch exists to emit them);
- neither: for every run (cheap hooks that keep the run's own bookkeeping: steps, crash
  context, warnings, distributed children).

Listed explicitly (not discovered) so the set of patches is easy to audit.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Installer:
    name: str  # recorded in ``Installation.probes`` when installed
    target: str  # "package.module:function"
    needed: bool = False
    events: tuple[str, ...] = ()

    def wanted(self, session: Any, needed: frozenset[str]) -> bool:
        if self.needed:
            return self.name in needed
        if self.events:
            return any(session.wants(kind) for kind in self.events)
        return True


INSTALLERS: tuple[Installer, ...] = (
    # D107: the class-target range, read before cross_entropy / nll_loss runs
    Installer("target_ranges", "nndoctor.instrument.inputs_probe:install", needed=True),
    # N101: global forward hooks armed for one forward after a non-finite loss
    Installer("nonfinite_tracer", "nndoctor.instrument.numerics_probe:install_nonfinite_tracer", needed=True),
    # B101/B103/O109/M108/N106: the user's line that built a layer or an optimizer
    Installer("construction_sites", "nndoctor.instrument.numerics_probe:install_construction_sites", needed=True),
    # R101: seeding calls
    Installer("seed_calls", "nndoctor.instrument.numerics_probe:install_seed_calls", needed=True),
    # crash context: failing batch indices (E checks); costs nothing unless a fetch raises
    Installer("batch_indices", "nndoctor.explain.instrument:install"),
    # step-time breakdown (P checks); returns at once unless the session is a perf session
    Installer("perf_timers", "nndoctor.perf.instrument:install"),
    # torch's warnings shown at the user's line, not ours
    Installer("warning_relay", "nndoctor.instrument.warning_relay:install"),
    # steps of loops that update parameters without torch.optim (sampling, --max-steps)
    Installer("manual_steps", "nndoctor.instrument.manual_steps:install"),
    # DDP wrappers and collectives (X checks, stall watchdog), this process's rank (report parts)
    Installer("distributed", "nndoctor.instrument.ddp_hooks:install"),
    # mp.spawn / mp.Process trainers report back to the parent
    Installer("child_processes", "nndoctor.distributed.children:install"),
    # R104/X110: the stall watchdog thread
    Installer("stall_watchdog", "nndoctor.watchdog:install", needed=True),
    # O110, O111, M111, P116: training-practice calls, installed per event kind subscribed to
    Installer("grad_clip", "nndoctor.instrument.training_probe:install_clipping", events=("grad_clip",)),
    Installer("scaler_step", "nndoctor.instrument.training_probe:install_scaler_step", events=("scaler_step",)),
    Installer("activation_checkpoint", "nndoctor.instrument.training_probe:install_checkpoint",
              events=("activation_checkpoint",)),
    Installer("debug_mode", "nndoctor.instrument.training_probe:install_debug_modes", events=("debug_mode",)),
    # M108/N106: the user's line that built a Conv or Linear layer
    Installer("construction_sites", "nndoctor.instrument.training_probe:install_layer_sites", needed=True),
    # P114: time in garbage collection
    Installer("gc_clock", "nndoctor.instrument.training_probe:install_gc_clock", needed=True),
    # P113: torch.compile's recompile-limit warnings
    Installer("compile_log", "nndoctor.instrument.training_probe:install_compile_log", needed=True),
    # M110: F.dropout without training=self.training
    Installer("dropout_calls", "nndoctor.instrument.dropout_probe:install", needed=True),
    # Keras 3 fit/evaluate (K checks, step counting); patches only if keras is imported
    Installer("keras", "nndoctor.keras.instrument:install"),
)

_RESOLVED: dict[str, Callable[[Any], None] | None] = {}


def resolve(target: str) -> Callable[[Any], None] | None:
    """The installer function of ``target``; None when its package is not there (a family
    that is absent, or that needs a framework that is not installed)."""
    if target not in _RESOLVED:
        module_name, _, function = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if not (error.name and module_name.startswith(error.name)):
                raise
            module = None
        _RESOLVED[target] = getattr(module, function) if module is not None else None
    return _RESOLVED[target]


def install_extensions(installation: Any) -> None:
    """Install every entry the session asks for, recording its name in ``installation.probes``."""
    session = installation.session
    needed = session.needed_probes()
    for entry in INSTALLERS:
        if not entry.wanted(session, needed):
            continue
        installer = resolve(entry.target)
        if installer is None:
            continue
        installer(installation)
        if entry.name not in installation.probes:  # one probe may have several installers
            installation.probes.append(entry.name)
