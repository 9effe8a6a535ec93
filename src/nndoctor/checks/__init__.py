"""Runtime checks of ``nndoctor run``, one module per family; importing registers them."""

from nndoctor.checks import (  # noqa: F401
    checkpoints,
    gradient_flow,
    memory,
    modes,
    optimizer_params,
    schedulers,
)
