"""Runtime checks of ``nndoctor run``, one module per family; importing registers them."""

from nndoctor.checks import (  # noqa: F401
    batchnorm,
    checkpoints,
    distributed,
    environment,
    gradient_flow,
    gradients,
    inputs,
    losses,
    memory,
    modes,
    numerics,
    optimizer_params,
    schedulers,
    stall,
    training_observed,
)
