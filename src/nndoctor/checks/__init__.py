"""Runtime checks of ``nndoctor run``, one module per family; importing registers them."""

from nndoctor.checks import (  # noqa: F401
    batchnorm,
    chance,
    checkpoints,
    environment,
    eval_layers,
    gradient_flow,
    gradients,
    inputs,
    losses,
    memory,
    modes,
    numerics,
    optimizer_params,
    schedulers,
    training_observed,
)
