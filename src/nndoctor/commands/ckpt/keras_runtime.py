"""Running Keras (3, torch backend) for conversion: loading the Keras model, reading its
layers with names and configs, and comparing its outputs with the PyTorch model's.

Keras is imported only here, only by ``convert``, with ``KERAS_BACKEND=torch`` so that no
TensorFlow is needed.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from nndoctor.commands.ckpt.keras_convert import SUPPORTED_KINDS, torch_slots
from nndoctor.commands.ckpt.keras_weights import KerasLayerWeights, snake_case
from nndoctor.util.errors import UsageError


def import_keras() -> Any:
    os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras
    except Exception as error:  # noqa: BLE001 - ImportError, or a backend that is not installed
        raise UsageError(f"verifying a conversion needs Keras 3 with KERAS_BACKEND=torch "
                         f"(pip install keras): {type(error).__name__}: {error}") from None
    if keras.backend.backend() != "torch":
        raise UsageError(f"Keras runs on the {keras.backend.backend()!r} backend; set KERAS_BACKEND=torch")
    return keras


def load_keras_model(source: str, spec: str | None, *, full_model: bool) -> Any | None:
    """The Keras model to compare against, or None when no architecture is available."""
    if spec:
        from nndoctor.commands.ckpt.model_spec import build_from_spec

        import_keras()
        model = build_from_spec(spec, option="--keras-model")
        try:
            model.load_weights(source)
        except Exception as error:  # noqa: BLE001 - the user's weights file and model: any failure is a usage error
            raise UsageError(f"--keras-model {spec!r} cannot load {source}: {error}") from None
        return model
    if not full_model:
        return None
    keras = import_keras()
    try:
        return keras.saving.load_model(source, compile=False, safe_mode=True)
    except Exception as error:  # noqa: BLE001 - Keras raises many types on a model it cannot rebuild: reported as usage error
        raise UsageError(f"{source}: Keras could not rebuild the model ({type(error).__name__}: "
                         f"{error}); pass --keras-model MODULE:CALLABLE to build it yourself") from None


def _sublayers(layer: Any) -> list[Any]:
    return list(getattr(layer, "layers", None) or [])


def _flatten_input_shape(layer: Any) -> tuple[int, ...] | None:
    """The channels-last shape a Flatten feeding this Dense layer received, if any."""
    try:
        producer = layer.input._keras_history.operation
    except Exception:  # noqa: BLE001 - Keras internals (_keras_history) vary by version: no shape, no fix
        return None
    if type(producer).__name__ != "Flatten" or getattr(producer, "data_format", "channels_last") != "channels_last":
        return None
    try:
        shape = tuple(producer.input.shape[1:])
    except Exception:  # noqa: BLE001 - Keras internals vary by version: no shape, no fix
        return None
    if len(shape) < 2 or any(d is None for d in shape):
        return None
    return tuple(int(d) for d in shape)


def live_layers(model: Any) -> list[KerasLayerWeights]:
    """Weighted layers of a live Keras model, named and configured, in model order."""
    found: list[KerasLayerWeights] = []

    def visit(layer: Any) -> None:
        kind = snake_case(type(layer).__name__)
        subs = _sublayers(layer)
        if kind not in SUPPORTED_KINDS and subs:
            for sub in subs:
                visit(sub)
            return
        if not layer.weights:
            return
        weights = {}
        for variable in layer.weights:
            short = variable.path.split("/")[-1] if hasattr(variable, "path") else variable.name
            weights[short.split(":")[0]] = np.asarray(variable.numpy())
        config = dict(layer.get_config())
        if kind == "dense":
            config["_flatten_from"] = _flatten_input_shape(layer)
        found.append(KerasLayerWeights(layer.name, layer.name, kind, weights, config))

    for layer in _sublayers(model) or [model]:
        visit(layer)
    return found


def _example_input(keras_model: Any, layers: list[KerasLayerWeights], seed: int) -> np.ndarray:
    shape = keras_model.inputs[0].shape
    dims = [2] + [d if d is not None else 5 for d in list(shape)[1:]]
    rng = np.random.default_rng(seed)
    dtype = str(keras_model.inputs[0].dtype)
    first = layers[0] if layers else None
    if "int" in dtype or (first is not None and first.kind == "embedding"):
        high = first.weights["embeddings"].shape[0] if first and first.kind == "embedding" else 10
        return rng.integers(0, high, size=dims).astype("int64")
    return rng.standard_normal(dims).astype("float32")


def _first_tensor(value: Any) -> Any:
    while isinstance(value, (tuple, list)):
        value = value[0]
    return value


def compare_outputs(keras_model: Any, torch_model: Any, layers: list[KerasLayerWeights], *,
                    input_layout: str = "auto", seed: int = 0) -> dict[str, Any]:
    """Run both models on the same random input; return shapes and the max abs difference."""
    import torch
    from torch import nn

    keras = import_keras()
    x = _example_input(keras_model, layers, seed)
    keras_out = np.asarray(keras.ops.convert_to_numpy(keras_model(x, training=False)), dtype=np.float64)
    if input_layout == "auto":
        slots = torch_slots(torch_model)
        first = slots[0][1] if slots else None
        conv_like = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.BatchNorm2d, nn.BatchNorm3d)
        input_layout = "channels_first" if x.ndim >= 3 and isinstance(first, conv_like) else "channels_last"
    torch_x = np.moveaxis(x, -1, 1) if input_layout == "channels_first" else x
    torch_model.eval()
    with torch.no_grad():
        out = _first_tensor(torch_model(torch.from_numpy(np.ascontiguousarray(torch_x))))
    torch_out = out.detach().cpu().double().numpy()
    if torch_out.shape != keras_out.shape and torch_out.ndim >= 3 and input_layout == "channels_first":
        torch_out = np.moveaxis(torch_out, 1, -1)
    result: dict[str, Any] = {"input_shape": list(x.shape), "input_layout": input_layout,
                              "keras_output_shape": list(keras_out.shape),
                              "torch_output_shape": list(torch_out.shape)}
    if torch_out.shape != keras_out.shape:
        result["max_abs_diff"] = float("inf")
        return result
    result["max_abs_diff"] = float(np.max(np.abs(torch_out - keras_out))) if keras_out.size else 0.0
    return result


def keras_model_from_variables(spec: str, layers: list[KerasLayerWeights], source: str) -> Any:
    """The Keras model built by ``spec``, its weights set from a TensorFlow checkpoint's layers.

    A checkpoint is not a Keras weights file (``load_weights`` refuses it), so the values are
    assigned here: by variable path when the paths agree (``sequential/conv2d/kernel``),
    otherwise layer by layer in model order within each layer type, as conversion pairs them
    (Keras numbers its auto-named layers per process, so the paths of a rebuilt model can
    differ from the saved ones)."""
    from nndoctor.commands.ckpt.keras_weights import _guess_kind
    from nndoctor.commands.ckpt.model_spec import build_from_spec

    import_keras()
    model = build_from_spec(spec, option="--keras-model")
    variables = list(getattr(model, "weights", []) or [])
    if not variables:
        raise UsageError(f"--keras-model {spec!r} has no weights: build it with an Input so that its "
                         f"layers exist")
    saved = {f"{layer.path}/{name}": array for layer in layers for name, array in layer.weights.items()}
    paths = [str(getattr(v, "path", "")) for v in variables]
    if set(paths) == set(saved):
        pairs = [(v, saved[p], p) for v, p in zip(variables, paths)]
    else:
        groups: dict[str, dict[str, Any]] = {}
        for variable, path in zip(variables, paths):
            parent, _, leaf = path.rpartition("/")
            groups.setdefault(parent, {})[leaf] = variable
        queues: dict[str, list[KerasLayerWeights]] = {}
        for layer in layers:
            queues.setdefault(layer.kind, []).append(layer)
        pairs = []
        for parent, live in groups.items():
            kind = _guess_kind(parent.rsplit("/", 1)[-1], {k: np.broadcast_to(np.zeros(()), tuple(v.shape)) for k, v in live.items()})
            if not queues.get(kind):
                raise UsageError(f"--keras-model {spec!r}: its layer {parent} ({kind}) has no counterpart in "
                                 f"{source}")
            layer = queues[kind].pop(0)
            if set(layer.weights) != set(live):
                raise UsageError(f"--keras-model {spec!r}: layer {parent} has variables {sorted(live)}, "
                                 f"{source}'s {layer.path} has {sorted(layer.weights)}")
            pairs += [(live[name], layer.weights[name], f"{layer.path}/{name}") for name in live]
        left = [layer.path for queue in queues.values() for layer in queue]
        if left:
            raise UsageError(f"--keras-model {spec!r} has no layer for {', '.join(left)} of {source}")
    for variable, array, saved_path in pairs:
        if tuple(variable.shape) != tuple(array.shape):
            raise UsageError(f"--keras-model {spec!r}: {variable.path} is {list(variable.shape)}, "
                             f"{source} stores {saved_path} as {list(array.shape)}")
        variable.assign(np.asarray(array))
    return model
