"""A whole run's instrumentation: the torch hook layer plus every feature's installer.

Each installer is ``install(installation) -> None``: it patches through
``installation.patcher`` (undone at uninstall) and emits events with
``installation.session.emit``; nothing patches torch on import. The list below is the
complete set, in installation order, imported explicitly so that the import graph, linters
and readers see every feature a run installs. A new feature adds its module here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from nndoctor.engine import Session
from nndoctor.keras import instrument as keras_instrument
from nndoctor.tfdata import instrument as tfdata_instrument

# Features that need no PyTorch: each patches Keras / tf.data only once the script imports it.
PLAIN_FEATURES: tuple[Callable, ...] = (
    keras_instrument.install,  # Keras 3 fit/evaluate (K checks); patches only if keras is imported
    tfdata_instrument.install,  # tf.data fetch times and pipelines (K106/K107); only if tensorflow is
)


def torch_available() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken install, or an import blocker
        return False


def torch_features() -> tuple[Callable, ...]:
    """The PyTorch features, in install order (imported here: they import torch)."""
    from nndoctor import watchdog
    from nndoctor.distributed import children
    from nndoctor.explain import instrument as crash_context
    from nndoctor.instrument import (
        ddp_hooks,
        dropout_probe,
        inputs_probe,
        manual_steps,
        numerics_probe,
        training_probe,
        warning_relay,
    )
    from nndoctor.perf import instrument as perf_instrument

    return (
        inputs_probe.install,  # input/loss statistics (D/L checks)
        numerics_probe.install,  # gradients, activations, seeds (O/N/B/R checks)
        crash_context.install,  # crash context: failing batch indices (E checks)
        perf_instrument.install,  # step-time breakdown (P checks); only in perf sessions
        warning_relay.install,  # torch's warnings shown at the user's line, not ours
        manual_steps.install,  # steps of loops that update parameters without torch.optim
        ddp_hooks.install,  # DDP wrappers and collectives (X checks, stall watchdog)
        children.install,  # mp.spawn / mp.Process trainers report back to the parent
        watchdog.install,  # R104/X110: the stall watchdog thread
        training_probe.install,  # clipping, GradScaler steps, checkpointing, anomaly mode
        dropout_probe.install,  # F.dropout without training=self.training (M110)
    )


def install(session: Session):
    """Instrument a run: the hooks, then every feature. ``uninstall()`` undoes it all.

    Without PyTorch (a TensorFlow-only environment) only the plain features are installed."""
    if torch_available():
        from nndoctor.instrument.torch_hooks import install as install_hooks

        return install_hooks(session, torch_features() + PLAIN_FEATURES)
    from nndoctor.instrument.plain import install as install_plain

    return install_plain(session, PLAIN_FEATURES)
