"""A whole run's instrumentation: the torch hook layer plus the features the run asks for.

Each feature's installer is ``install(installation) -> None``: it patches through
``installation.patcher`` (undone at uninstall) and emits events with
``installation.session.emit``; nothing patches torch on import. The lists below are the
complete set, in installation order, imported explicitly so that the import graph, linters
and readers see every feature a run may install; ``instrument/features.py`` says when each
one is installed (always, when a check ``needs`` it, or when an event kind it emits is
subscribed to). A new feature adds its entry here.
"""

from __future__ import annotations

import importlib.util

from nndoctor.core.engine import Session
from nndoctor.instrument.features import Feature
from nndoctor.instrument.installation import InstallationProtocol


def torch_available() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken install, or an import blocker
        return False


def plain_features() -> tuple[Feature, ...]:
    """Features that need no PyTorch: each patches Keras / tf.data only once the script imports it."""
    from nndoctor.commands.perf.tf import instrument as perf_tf_instrument
    from nndoctor.keras import instrument as keras_instrument
    from nndoctor.tfdata import instrument as tfdata_instrument

    return (
        # Keras 3 fit/evaluate: step counting and --max-steps for every Keras run (like
        # manual_steps), and the K checks; only an import hook until the script imports keras
        Feature("keras", keras_instrument.install),
        # tf.data fetch times and pipelines (K106/K107, D105's tf.data variant): adds those checks
        # to the session and returns at once when none is enabled
        Feature("tfdata", tfdata_instrument.install),
        # nndoctor perf on TensorFlow: input wait vs compute per step (returns at once outside perf)
        Feature("perf_tf_timers", perf_tf_instrument.install),
    )


def torch_features() -> tuple[Feature, ...]:
    """The PyTorch features, in install order (imported here: they import torch)."""
    from nndoctor.commands.explain import instrument as crash_context
    from nndoctor.commands.perf.torch import instrument as perf_instrument
    from nndoctor.instrument import (
        ddp_hooks,
        dropout_probe,
        inputs_probe,
        loss_sum,
        manual_steps,
        numerics_probe,
        tensorboard_probe,
        training_probe,
        warning_relay,
    )
    from nndoctor.run import watchdog
    from nndoctor.run.distributed import children

    return (
        # D107: the class-target range, read before cross_entropy / nll_loss runs
        Feature("target_ranges", inputs_probe.install, needed=True),
        # N101: global forward hooks armed for one forward after a non-finite loss
        Feature("nonfinite_tracer", numerics_probe.install_nonfinite_tracer, needed=True),
        # B101/B103/O109/M108/N106: the user's line that built a layer or an optimizer
        Feature("construction_sites", numerics_probe.install_construction_sites, needed=True),
        # R101: seeding calls
        Feature("seed_calls", numerics_probe.install_seed_calls, needed=True),
        # crash context: failing batch indices (E checks); costs nothing unless a fetch raises
        Feature("batch_indices", crash_context.install),
        # step-time breakdown of `nndoctor perf`: needed by the perf recorder, not by a check
        Feature("perf_timers", perf_instrument.install, needed=True),
        # torch's warnings shown at the user's line, not ours
        Feature("warning_relay", warning_relay.install),
        # steps of loops that update parameters without torch.optim (sampling, --max-steps)
        Feature("manual_steps", manual_steps.install),
        # DataParallel gathers and summed losses (X106); before ddp_hooks, so that its all_reduce
        # wrapper sits inside theirs
        Feature("loss_sums", loss_sum.install),
        # DDP wrappers and collectives (X checks, stall watchdog), this process's rank (report parts)
        Feature("distributed", ddp_hooks.install),
        # mp.spawn / mp.Process trainers report back to the parent
        Feature("child_processes", children.install),
        # R104/X110: the stall watchdog thread
        Feature("stall_watchdog", watchdog.install, needed=True),
        # O110, O111, M111, P116: training-practice calls, installed per event kind subscribed to
        Feature("grad_clip", training_probe.install_clipping, events=("grad_clip",)),
        Feature("scaler_step", training_probe.install_scaler_step, events=("scaler_step",)),
        Feature("activation_checkpoint", training_probe.install_checkpoint, events=("activation_checkpoint",)),
        Feature("debug_mode", training_probe.install_debug_modes, events=("debug_mode",)),
        # M108/N106: the user's line that built a Conv or Linear layer
        Feature("construction_sites", training_probe.install_layer_sites, needed=True),
        # P114: time in garbage collection
        Feature("gc_clock", training_probe.install_gc_clock, needed=True),
        # P113: torch.compile's recompile-limit warnings
        Feature("compile_log", training_probe.install_compile_log, needed=True),
        # M110: F.dropout without training=self.training
        Feature("dropout_calls", dropout_probe.install, needed=True),
        # R103: SummaryWriter add_*/flush/close, patched once the script imports torch.utils.tensorboard
        Feature("tensorboard_writers", tensorboard_probe.install, needed=True),
    )


def install(session: Session) -> InstallationProtocol:
    """Instrument a run: the hooks, then the features it asks for. ``uninstall()`` undoes it all.

    Without PyTorch (a TensorFlow-only environment), or for a session that does not instrument
    it (``Session.instruments_torch``), only the plain features are installed."""
    if session.instruments_torch and torch_available():
        from nndoctor.instrument.torch_hooks import install as install_hooks

        return install_hooks(session, torch_features() + plain_features())
    from nndoctor.instrument.plain import install as install_plain

    return install_plain(session, plain_features())
