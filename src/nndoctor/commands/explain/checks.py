"""The catalog's E codes: importing this module registers one explanation per code.

The registry imports ``nndoctor.commands.explain.checks`` (``registry.CHECK_MODULES``); the
explanations live in small family modules, listed here.
"""

from __future__ import annotations

from nndoctor.commands.explain import (
    autograd,
    compile_limits,
    data_parallel,
    devices,
    distributed,
    dtypes,
    environment,
    keras_input,
    keras_losses,
    loading,
    memory,
    shapes,
    state,
    tensor_cores,
    tf_errors,
    tf_gradients,
    tfrecord_parse,
)

FAMILIES = (devices, dtypes, memory, shapes, autograd, loading, state, environment, distributed,
            tf_errors, tf_gradients, keras_input, tfrecord_parse, keras_losses, compile_limits,
            tensor_cores, data_parallel)

__all__ = ["FAMILIES"]
