"""N101 on Keras: the first layer whose output is non-finite, found after the fact (and N103's
ReLU activity after ``fit``, by the same walk).

The batch is run again through the model's layers one by one with ``Layer.stateless_call``
on the current values of each layer's variables. Nothing is assigned: BatchNormalization's
moving statistics, seed generators and the optimizer's state keep their values, and the
layers that draw random numbers (Dropout, noise, random augmentation) run in inference mode
so that no random stream advances. At most ``MAX_ROWS`` samples are run, under
``torch.no_grad`` on the torch backend. Only models with a layer graph (a Sequential, a
functional model) can be walked: a subclassed model's ``call`` is Python code that nndoctor
cannot step through, and the finding then names no layer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from nndoctor.keras.facts import MAX_ROWS

# Layers that draw random numbers in training mode: run in inference mode (no draw).
_RANDOM_LAYERS = ("Dropout", "Noise", "Random")


@dataclass(frozen=True)
class LayerOutcome:
    """The first layer whose output was non-finite on the batch run again."""

    name: str
    class_name: str
    first_layer: bool  # the first layer the batch reached
    inputs_finite: bool
    weights_finite: bool


@dataclass(frozen=True)
class Origin:
    """Where a non-finite Keras loss came from, as N101 words it (plain data)."""

    step: int
    walked: bool  # the model's layers could be run again
    exact: bool  # run on the failing batch with the weights it met (before the update)
    layer: LayerOutcome | None
    samples: int = 0
    batch_seen: bool = True  # the model and the batch it was given are known
    compiled: bool = False  # the loss a tf.function training step returned: its insides were not seen


def _finite(value: Any) -> bool:
    import numpy as np
    from keras import ops

    array = np.asarray(ops.convert_to_numpy(value))
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.complexfloating)):
        return True
    return bool(np.isfinite(array).all())


def _all_finite(values: Any) -> bool:
    from keras import tree

    return all(_finite(v) for v in tree.flatten(values) if hasattr(v, "shape"))


def walk_layers(model: Any, x: Any, visit: Any, rows: int = MAX_ROWS) -> int | None:
    """Run ``x[:rows]`` through the model's layers one by one, calling ``visit(layer, args, kwargs,
    output, weights)`` after each; the samples run, or None when the model cannot be walked
    (subclassed, several inputs) or ``x`` is not one array/tensor."""
    import keras

    if x is None or isinstance(x, (dict, list, tuple)) or not hasattr(x, "shape") or not hasattr(x, "__getitem__"):
        return None
    graph = getattr(model, "_functional", None) or model
    walkable = hasattr(graph, "_run_through_graph") and len(getattr(graph, "inputs", ()) or ()) == 1
    if not walkable and not isinstance(model, keras.Sequential):
        return None
    batch = _as_fit_input(x[:rows])

    def run(layer: Any, *args: Any, **kwargs: Any) -> Any:
        if "training" in kwargs or _takes_training(layer):
            kwargs["training"] = not any(marker in type(layer).__name__ for marker in _RANDOM_LAYERS)
        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]
        output, _ = layer.stateless_call(trainable, non_trainable, *args, **kwargs)
        visit(layer, args, kwargs, output, trainable + non_trainable)
        return output

    with _no_grad():
        if walkable:
            graph._run_through_graph(batch, operation_fn=lambda layer: lambda *a, **k: run(layer, *a, **k))
        else:  # a Sequential built without an Input: its call is the layers in turn
            output = batch
            for layer in model.layers:
                output = run(layer, output)
    return int(batch.shape[0])


def _as_fit_input(batch: Any) -> Any:
    """The rows as ``fit`` gives them to the model: the backend's own tensor, floating values cast
    to ``keras.config.floatx()`` (Keras's data adapters cast float64 arrays, e.g. NumPy's default
    noise, to float32: a float64 batch would not meet the float32 variables of the layers)."""
    import keras
    from keras.src import backend

    if not hasattr(batch, "device"):  # NumPy: as the backend's own tensor, like fit does
        batch = keras.ops.convert_to_tensor(batch)
    dtype = backend.standardize_dtype(batch.dtype)
    if backend.is_float_dtype(dtype) and dtype != keras.config.floatx():
        batch = keras.ops.cast(batch, keras.config.floatx())
    return batch


def first_nonfinite_layer(model: Any, x: Any) -> tuple[LayerOutcome | None, int] | None:
    """(the first layer with a non-finite output or None, samples run); None when the model
    cannot be walked (subclassed, several inputs) or ``x`` is not one array/tensor."""
    found: list[LayerOutcome] = []
    ran = [0]

    def visit(layer: Any, args: tuple, kwargs: dict, output: Any, weights: list) -> None:
        ran[0] += 1
        if not found and not _all_finite(output):
            found.append(LayerOutcome(
                name=str(layer.name), class_name=type(layer).__name__, first_layer=ran[0] == 1,
                inputs_finite=_all_finite((args, kwargs)), weights_finite=_all_finite(weights)))

    samples = walk_layers(model, x, visit)
    if samples is None:
        return None
    return (found[0] if found else None), samples


def _takes_training(layer: Any) -> bool:
    return bool(getattr(layer, "_call_has_training_arg", False))


def _no_grad() -> Any:
    import keras

    if keras.config.backend() == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def explain(origin: Origin, where: str) -> str:
    """The N101 message for a Keras/TensorFlow run (``where``: "fit" or "the training loop")."""
    head = f"The loss became non-finite (NaN/Inf) at step {origin.step} of {where}."
    if origin.compiled:
        return head + (" The step runs as a compiled tf.function, whose batch and layer outputs nndoctor does not "
                       "read, so the layer that produced it is not known: run it again under nndoctor with "
                       "tf.config.run_functions_eagerly(True) to have the layer named, or with "
                       "tf.debugging.enable_check_numerics() to stop at the first op whose output is non-finite.")
    if not origin.batch_seen:
        return head + (" The batch given to the model was not seen (a model called outside the GradientTape, "
                       "or data given to fit as a dataset or generator), so the layer that produced it is not "
                       "known: run with tf.debugging.enable_check_numerics() to stop at the first op whose "
                       "output is non-finite.")
    if not origin.walked:
        return head + (" The model has no layer graph to run again (a subclassed model, or several inputs), so "
                       "the layer that produced it is not known: run with tf.debugging.enable_check_numerics() "
                       "to stop at the first op whose output is non-finite.")
    layer = origin.layer
    ran = (f"checked on the failing batch of {origin.samples} samples, run again through the layers" if origin.exact
           else f"checked on {origin.samples} samples of the data given to fit, run again through the layers after "
                "the update")
    if layer is None:
        return head + (f" No layer output was non-finite ({ran}): the NaN/Inf is produced in the loss computation "
                       "(an overflow, log(0), division by zero in a hand-written loss) or by the sample weights.")
    named = f"`{layer.name}` ({layer.class_name})"
    if not layer.inputs_finite and layer.first_layer:
        return head + f" The input batch already held NaN/Inf: the first layer, {named}, received it ({ran})."
    if not layer.weights_finite:
        text = head + (f" The first layer whose output is non-finite is {named}, whose weights are already "
                       f"non-finite ({ran}): an optimizer step applied non-finite gradients.")
        if not origin.exact:
            text += (" The failing batch itself ran inside the compiled train function; compile with "
                     "run_eagerly=True (and a fixed seed) to trace that step before its update.")
        return text
    if not layer.inputs_finite:
        return head + (f" The first layer whose output is non-finite is {named}; its inputs were already "
                       f"non-finite, produced outside the layers ({ran}).")
    return head + (f" The first layer whose output is non-finite is {named}, while its inputs and weights were "
                   f"finite ({ran}): the NaN/Inf is created there (overflow, log/sqrt/division of out-of-domain "
                   "values).")
