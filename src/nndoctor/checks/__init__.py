"""Runtime checks of ``nndoctor run``, one module per family; importing registers them."""

from nndoctor.checks import (  # noqa: F401
    activation_checkpointing,
    amp,
    architecture,
    batchnorm,
    checkpoints,
    data_workers,
    debug_modes,
    environment,
    evaluation,
    finetuning,
    gradient_flow,
    gradients,
    inputs,
    labels,
    losses,
    memory,
    modes,
    numerics,
    optimizer_params,
    schedulers,
)
