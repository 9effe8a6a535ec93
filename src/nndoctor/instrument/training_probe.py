"""Instrumentation for training-practice checks: gradient clipping, GradScaler steps,
activation checkpointing and debugging modes (O110, O111, M111, P116).

Each patch calls the original with the user's own arguments and only observes:

* ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` -> ``grad_clip``, with whether
  the clipped gradients were still multiplied by a GradScaler's scale (its per-optimizer
  stage is not ``UNSCALED`` after a scaled backward). A generator of parameters is turned
  into a list first so that both the original and we can read it.
* ``GradScaler.step`` -> ``scaler_step``: a step is *skipped* when the optimizer's step
  count did not move (the scaler found Inf/NaN gradients). No device read: the scaler has
  already synchronised to decide.
* ``torch.utils.checkpoint.checkpoint`` -> ``activation_checkpoint``, emitted only in the
  suspicious case (reentrant, gradients on, no input requiring grad), so the common call
  costs a few attribute reads.
* ``torch.autograd.set_detect_anomaly`` / ``detect_anomaly`` / ``torch.profiler.profile.start``
  -> ``debug_mode``.
* a logging handler on ``torch._dynamo.convert_frame`` keeping its recompile-limit warnings
  (``compile_log``); nothing is added to or removed from what the user sees.
* ``gc.callbacks``: a clock of the time spent in garbage collection (``gc_clock``).
* ``Conv*d`` / ``Linear`` constructors: the user's line, in the numerics probe's table of
  construction sites (``construction_site``).
"""

from __future__ import annotations

import functools
import sys
import time
from typing import TYPE_CHECKING, Any

import torch

from nndoctor.core import events as ev
from nndoctor.core.stash import StashKey

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol
    from nndoctor.instrument.torch_hooks import Installation

# Each ``install_*`` is listed in instrument/extensions.py: the event patches are installed when
# a check subscribes to their event kind, the records when an enabled check needs them.


# -- gradient clipping ----------------------------------------------------------------------------
def clipped_while_scaled(session: Any, params: list[torch.Tensor]) -> tuple[bool, Any]:
    """(True, scaler) when a GradScaler scaled this step's loss and the optimizer owning
    ``params`` has not been unscaled yet."""
    ref = session.state.scaler
    scaler = ref() if ref is not None else None
    if scaler is None or not scaler.is_enabled() or getattr(scaler, "_scale", None) is None:
        return False, scaler
    if session.state.backwards_since_step <= 0:
        return False, scaler
    from torch.amp.grad_scaler import OptState

    owners = session.state.optimizer_param_ids()
    optimizers = {}
    for p in params:
        owner = owners.get(id(p))
        optimizer = owner() if owner is not None else None
        if optimizer is not None:
            optimizers[id(optimizer)] = optimizer
    if not optimizers:
        return False, scaler
    states = getattr(scaler, "_per_optimizer_states", {})
    for key in optimizers:
        stage = states.get(key, {}).get("stage", OptState.READY)
        if stage is not OptState.UNSCALED:
            return True, scaler
    return False, scaler


def install_clipping(installation: Installation) -> None:
    import torch.nn.utils as nn_utils
    import torch.nn.utils.clip_grad as clip_grad

    session = installation.session

    def make(original: Any, name: str, limit_name: str) -> Any:
        @functools.wraps(original)
        def clip(parameters, *args, **kwargs):
            if not session.active or not session.wants("grad_clip"):
                return original(parameters, *args, **kwargs)
            if isinstance(parameters, torch.Tensor):
                params = [parameters]
            else:
                parameters = params = list(parameters)
            result = original(parameters, *args, **kwargs)
            frame = sys._getframe(1)

            def emit() -> None:
                scaled, scaler = clipped_while_scaled(session, params)
                limit = args[0] if args else kwargs.get(limit_name)
                session.emit(ev.GradClip(
                    step=session.step, sampled=session.sampled, frame=frame, function=name,
                    limit=float(limit) if isinstance(limit, (int, float)) else None,
                    total_norm=result, scaled=scaled, scaler=scaler))

            installation._safe(emit)
            return result

        return clip

    for name, limit_name in (("clip_grad_norm_", "max_norm"), ("clip_grad_value_", "clip_value")):
        original = getattr(clip_grad, name, None)
        if original is None:
            continue
        wrapper = make(original, name, limit_name)
        installation.patcher.patch(clip_grad, name, wrapper)
        if getattr(nn_utils, name, None) is original:
            installation.patcher.patch(nn_utils, name, wrapper)


# -- GradScaler.step ------------------------------------------------------------------------------
def install_scaler_step(installation: Installation) -> None:
    try:
        from torch.amp.grad_scaler import GradScaler
    except ImportError:  # pragma: no cover - very old torch
        return
    session = installation.session
    original = GradScaler.step

    @functools.wraps(original)
    def step(scaler, optimizer, *args, **kwargs):
        if not session.active or not session.wants("scaler_step"):
            return original(scaler, optimizer, *args, **kwargs)
        state = session.state
        before = state.steps_of(optimizer)
        result = original(scaler, optimizer, *args, **kwargs)
        if scaler.is_enabled():
            frame = sys._getframe(1)
            skipped = state.steps_of(optimizer) == before
            installation._safe(lambda: session.emit(ev.ScalerStep(
                step=session.step, sampled=session.sampled, frame=frame, scaler=scaler,
                optimizer=optimizer, skipped=skipped)))
        return result

    installation.patcher.patch(GradScaler, "step", step)


# -- activation checkpointing ---------------------------------------------------------------------
def trainable_parameter_count(function: Any, depth: int = 2) -> int:
    """Trainable parameters reachable from a checkpointed callable: a module, a bound method
    of one, a ``functools.partial``, or modules captured in a closure (checkpoint_sequential)."""
    modules: list[torch.nn.Module] = []

    def collect(obj: Any, level: int) -> None:
        if isinstance(obj, torch.nn.Module):
            modules.append(obj)
        elif isinstance(obj, (list, tuple)) and level > 0:
            for item in obj[:256]:
                collect(item, level - 1)
        elif isinstance(obj, functools.partial) and level > 0:
            collect(obj.func, level - 1)
            for item in obj.args:
                collect(item, level - 1)
        elif level > 0:
            owner = getattr(obj, "__self__", None)
            if owner is not None:
                collect(owner, level - 1)
            for cell in getattr(obj, "__closure__", None) or ():
                try:
                    collect(cell.cell_contents, level - 1)
                except ValueError:  # an empty cell
                    continue

    collect(function, depth)
    seen: set[int] = set()
    total = 0
    for module in modules:
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                total += 1
    return total


def _any_requires_grad(values: Any, depth: int = 2) -> bool:
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.requires_grad:
                return True
        elif isinstance(value, (list, tuple)) and depth > 0 and _any_requires_grad(value, depth - 1):
            return True
    return False


def install_checkpoint(installation: Installation) -> None:
    import torch.utils.checkpoint as checkpoint_module

    session = installation.session
    original = checkpoint_module.checkpoint

    @functools.wraps(original)
    def checkpoint(function=None, *args, use_reentrant=None, **kwargs):
        if (session.active and function is not None and use_reentrant is not False
                and session.wants("activation_checkpoint") and torch.is_grad_enabled()
                and not _any_requires_grad(args)):
            frame = sys._getframe(1)

            def emit() -> None:
                session.emit(ev.ActivationCheckpoint(
                    step=session.step, sampled=session.sampled, frame=frame, function=function,
                    use_reentrant=use_reentrant, grad_enabled=True, inputs_require_grad=False,
                    trainable_parameters=trainable_parameter_count(function),
                    function_name=_callable_name(function)))

            installation._safe(emit)
        return original(function, *args, use_reentrant=use_reentrant, **kwargs)

    installation.patcher.patch(checkpoint_module, "checkpoint", checkpoint)


def _callable_name(function: Any) -> str:
    if isinstance(function, torch.nn.Module):
        return type(function).__name__
    owner = getattr(function, "__self__", None)
    name = getattr(function, "__qualname__", None) or getattr(function, "__name__", None)
    if owner is not None and isinstance(owner, torch.nn.Module):
        return f"{type(owner).__name__}.{getattr(function, '__name__', 'forward')}"
    return str(name or type(function).__name__)


# -- anomaly detection ----------------------------------------------------------------------------
def install_debug_modes(installation: Installation) -> None:
    from torch.autograd import anomaly_mode

    session = installation.session
    set_class = anomaly_mode.set_detect_anomaly
    original_init = set_class.__init__

    @functools.wraps(original_init)
    def set_init(self, mode: bool, *args, **kwargs):
        original_init(self, mode, *args, **kwargs)
        if session.active and session.wants("debug_mode"):
            frame = sys._getframe(1)
            installation._safe(lambda: session.emit(ev.DebugModeSet(
                step=session.step, sampled=session.sampled, frame=frame, mode="anomaly",
                enabled=bool(mode))))

    installation.patcher.patch(set_class, "__init__", set_init)

    context_class = anomaly_mode.detect_anomaly
    original_enter = context_class.__enter__

    @functools.wraps(original_enter)
    def enter(self):
        result = original_enter(self)
        if session.active and session.wants("debug_mode"):
            frame = sys._getframe(1)
            installation._safe(lambda: session.emit(ev.DebugModeSet(
                step=session.step, sampled=session.sampled, frame=frame, mode="anomaly", enabled=True)))
        return result

    installation.patcher.patch(context_class, "__enter__", enter)

    try:
        from torch.profiler import profile as profiler_class
    except ImportError:  # pragma: no cover - torch without kineto
        return
    original_start = profiler_class.start

    @functools.wraps(original_start)
    def start(self, *args, **kwargs):
        result = original_start(self, *args, **kwargs)
        if session.active and session.wants("debug_mode"):
            frame = sys._getframe(1)
            installation._safe(lambda: session.emit(ev.DebugModeSet(
                step=session.step, sampled=session.sampled, frame=frame, mode="profiler", enabled=True)))
        return result

    installation.patcher.patch(profiler_class, "start", start)
    _patch_gradcheck(installation)


# -- construction sites of convolutions and linear layers -----------------------------------------
def install_layer_sites(installation: InstallationProtocol) -> None:
    """Record the user's line that built each Conv/Linear layer (M108, N106 point at it), in
    the numerics probe's table of construction sites."""
    from torch.nn.modules.conv import _ConvNd

    from nndoctor.core.user_code import user_location
    from nndoctor.instrument.numerics_probe import probe_state

    session = installation.session
    sites = probe_state(session).sites
    for owner in (_ConvNd, torch.nn.Linear):
        original = owner.__dict__["__init__"]

        def make(original: Any) -> Any:
            @functools.wraps(original)
            def __init__(self, *args, **kwargs):
                original(self, *args, **kwargs)
                if session.active and self not in sites:
                    try:
                        where = user_location(sys._getframe(1))
                        if where is not None:
                            sites[self] = where
                    except Exception as error:  # noqa: BLE001 - observer rule
                        session.internal_error("layer construction site", error)
            return __init__

        installation.patcher.patch(owner, "__init__", make(original))


# -- garbage-collection pauses --------------------------------------------------------------------
class GcClock:
    """Seconds spent in the garbage collector since install (P114 attributes slow steps)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started: float | None = None

    def callback(self, phase: str, info: dict, clock: Any = time.perf_counter) -> None:
        # The clock bound once: an import statement here ran on every collection, and failed
        # ("import of time halted") in collections at interpreter shutdown.
        if phase == "start":
            self._started = clock()
        elif self._started is not None:
            self.seconds += clock() - self._started
            self._started = None


GC_CLOCK = StashKey[GcClock]("garbage-collection clock")


def gc_clock(session: Any) -> GcClock | None:
    """The session's GC clock (None when the probe is not installed)."""
    return session.stash.get(GC_CLOCK, None)


def install_gc_clock(installation: InstallationProtocol) -> None:
    import gc

    clock = installation.session.stash[GC_CLOCK] = GcClock()
    gc.callbacks.append(clock.callback)

    def remove() -> None:
        if clock.callback in gc.callbacks:
            gc.callbacks.remove(clock.callback)

    installation.patcher.on_undo(remove)


def _patch_gradcheck(installation: Installation) -> None:
    """Time torch.autograd.gradcheck/gradgradcheck calls (P116: numerical gradient checks run
    inside the training loop). gradgradcheck calls gradcheck: only the outer call is timed."""
    import importlib
    import threading
    import time

    # sys.modules, not ``import … as``: torch.autograd.gradcheck is also the function's name.
    gradcheck_module = importlib.import_module("torch.autograd.gradcheck")
    session = installation.session
    busy = threading.local()
    for name in ("gradcheck", "gradgradcheck"):
        original = getattr(gradcheck_module, name, None)
        if original is None:
            continue

        def timed(*args, __original=original, __name=name, **kwargs):
            if getattr(busy, "on", False) or not session.active:
                return __original(*args, **kwargs)
            busy.on = True
            start = time.perf_counter()
            try:
                return __original(*args, **kwargs)
            finally:
                busy.on = False
                seconds = time.perf_counter() - start
                if session.wants("debug_mode"):
                    frame = sys._getframe(1)
                    installation._safe(lambda: session.emit(ev.DebugModeSet(
                        step=session.step, sampled=session.sampled, frame=frame, mode=__name,
                        enabled=True, seconds=seconds)))

        functools.update_wrapper(timed, original)
        installation.patcher.patch(gradcheck_module, name, timed)
        if getattr(torch.autograd, name, None) is original:
            installation.patcher.patch(torch.autograd, name, timed)


# -- torch.compile's warnings ---------------------------------------------------------------------
class CompileLog:
    """The recompile-limit warnings torch._dynamo logs (function, file:line, last guard that
    failed), captured by a logging handler that does not change what the user sees."""

    def __init__(self) -> None:
        self.limit_hits: list[str] = []

    def record(self, message: str) -> None:
        if len(self.limit_hits) < 20:
            self.limit_hits.append(message)


COMPILE_LOG = StashKey[CompileLog]("torch.compile recompile-limit warnings")


def compile_log(session: Any) -> CompileLog | None:
    """The session's compile log (None when the probe is not installed)."""
    return session.stash.get(COMPILE_LOG, None)


def install_compile_log(installation: InstallationProtocol) -> None:
    import logging

    log = installation.session.stash[COMPILE_LOG] = CompileLog()

    class _Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                message = record.getMessage()
            except Exception:  # noqa: BLE001 - a malformed record is not ours to fix
                return
            if "recompile_limit" in message or "cache_size_limit" in message:
                log.record(message)

    handler = _Handler(level=logging.WARNING)
    logger = logging.getLogger("torch._dynamo.convert_frame")
    logger.addHandler(handler)
    installation.patcher.on_undo(lambda: logger.removeHandler(handler))
