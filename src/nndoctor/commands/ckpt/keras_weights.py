"""Reading Keras weight files with h5py alone (no Keras, no TensorFlow).

Two layouts exist:
- Keras 3 (``.weights.h5``, and ``model.weights.h5`` inside a ``.keras`` zip): one group per
  layer under ``layers/``, named after the layer's class in snake case with a per-class
  counter (``conv2d``, ``conv2d_1`` …); variables are unnamed datasets ``vars/0``,
  ``vars/1`` … (RNN cells keep theirs under ``cell/vars``). The counter preserves the order
  of layers *of one class*, which is what conversion matches on.
- Legacy HDF5 (``model.save("m.h5")``, Keras 2 ``save_weights("w.h5")``): attribute
  ``layer_names`` gives the layer order, ``weight_names`` the variable names.

The file may be hostile: groups are visited once each (HDF5 hard links can form cycles), and
the arrays read may not add up to more than the file's size plus the inflate limit (a
compressed or never-written dataset can declare gigabytes in a few bytes).
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from typing import Any

from nndoctor.util.errors import UsageError
from nndoctor.util.limits import ReadLimits, megabytes


class _ReadBudget:
    """Bytes of arrays still allowed to be read from one file."""

    def __init__(self, file_size: int, limits: ReadLimits) -> None:
        self.left = file_size + limits.max_inflate_bytes
        self.visited: set[Any] = set()

    def read(self, dataset: Any) -> Any:
        nbytes = int(getattr(dataset, "nbytes", 0) or 0)
        if nbytes > self.left:
            raise UsageError(f"the HDF5 dataset {dataset.name!r} declares {megabytes(nbytes)}, more than "
                             f"the file can hold plus the inflate limit (NNDOCTOR_MAX_INFLATE_MB): not read")
        self.left -= nbytes
        return dataset[()]

    def first_visit(self, group: Any) -> bool:
        key = group.id
        if key in self.visited:
            return False
        self.visited.add(key)
        return True

_VAR_NAMES = {
    "dense": ["kernel", "bias"],
    "conv1d": ["kernel", "bias"],
    "conv2d": ["kernel", "bias"],
    "conv3d": ["kernel", "bias"],
    "depthwise_conv1d": ["kernel", "bias"],
    "depthwise_conv2d": ["kernel", "bias"],
    "separable_conv1d": ["depthwise_kernel", "pointwise_kernel", "bias"],
    "separable_conv2d": ["depthwise_kernel", "pointwise_kernel", "bias"],
    "embedding": ["embeddings"],
    "lstm": ["kernel", "recurrent_kernel", "bias"],
    "gru": ["kernel", "recurrent_kernel", "bias"],
}


@dataclass
class KerasLayerWeights:
    """The weights of one Keras layer, named the way Keras names them."""

    name: str
    path: str
    kind: str  # snake-case class name: conv2d, dense, batch_normalization …
    weights: dict[str, Any]  # variable name -> numpy array, in Keras order
    config: dict[str, Any] = field(default_factory=dict)


def snake_case(class_name: str) -> str:
    """Keras's own rule for turning a class name into a layer/group name."""
    text = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", class_name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", text).lower()


def _natural_key(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _strip_counter(group_name: str) -> str:
    return re.sub(r"_\d+$", "", group_name)


def variable_names(kind: str, count: int, config: dict[str, Any]) -> list[str]:
    """Names of a Keras 3 layer's unnamed ``vars/N`` datasets, by layer kind."""
    if kind == "batch_normalization":
        # Without a config, three variables are taken as gamma + moving statistics.
        scale = config.get("scale", True)
        center = config.get("center", count != 3)
        names = (["gamma"] if scale else []) + (["beta"] if center else [])
        names += ["moving_mean", "moving_variance"]
    elif kind == "layer_normalization":
        names = (["gamma"] if config.get("scale", True) else []) + (
            ["beta"] if config.get("center", True) else [])
    else:
        names = list(_VAR_NAMES.get(kind, []))
    if len(names) < count:
        names += [f"var_{i}" for i in range(len(names), count)]
    return names[:count]


def read_keras_file(path: str) -> tuple[str, list[KerasLayerWeights], dict[str, Any]]:
    """(format, layers, model config or {}) for a .keras, .h5 or .weights.h5 file."""
    import h5py

    limits = ReadLimits.from_env()
    if zipfile.is_zipfile(path):
        from nndoctor.commands.ckpt.embedded import check_zip_sizes

        with zipfile.ZipFile(path) as archive:
            check_zip_sizes(path, archive, os.path.getsize(path), limits)
            names = archive.namelist()
            config = json.loads(archive.read("config.json")) if "config.json" in names else {}
            if "model.weights.h5" not in names:
                raise ValueError("a .keras archive without model.weights.h5")
            data = archive.read("model.weights.h5")
        budget = _ReadBudget(len(data), limits)
        with h5py.File(io.BytesIO(data), "r") as handle:
            return "keras-zip", _read_keras3(handle, "", _layer_configs(config), budget), config
    budget = _ReadBudget(os.path.getsize(path), limits)
    with h5py.File(path, "r") as handle:
        if "layers" in handle or ("vars" in handle and "layer_names" not in handle.attrs):
            return "keras-weights-h5", _read_keras3(handle, "", {}, budget), {}
        config = {}
        raw = handle.attrs.get("model_config")
        if raw is not None:
            config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        root = handle["model_weights"] if "model_weights" in handle else handle
        return "keras-legacy-h5", _read_legacy(root, _layer_configs(config), budget), config


def _layer_configs(model_config: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """class snake name -> configs of that class's layers in model order (nested models flattened)."""
    by_kind: dict[str, list[dict[str, Any]]] = {}

    def visit(entry: dict[str, Any]) -> None:
        config = entry.get("config") or {}
        for layer in config.get("layers", []) or []:
            kind = snake_case(layer.get("class_name", ""))
            by_kind.setdefault(kind, []).append(dict(layer.get("config") or {}))
            if isinstance(layer.get("config"), dict) and "layers" in layer["config"]:
                visit(layer)

    if model_config:
        visit(model_config)
    return by_kind


def _read_keras3(group: Any, prefix: str, configs: dict[str, list[dict[str, Any]]],
                 budget: _ReadBudget) -> list[KerasLayerWeights]:
    layers: list[KerasLayerWeights] = []
    container = group.get("layers")
    if container is None or not budget.first_visit(container):
        return layers
    for name in sorted(container.keys(), key=_natural_key):
        sub = container[name]
        path = f"{prefix}layers/{name}"
        if "layers" in sub:
            layers.extend(_read_keras3(sub, path + "/", configs, budget))
            continue
        arrays = []
        display = name
        for vars_path in ("vars", "cell/vars"):
            if vars_path in sub:
                vars_group = sub[vars_path]
                display = str(vars_group.attrs.get("name", display)) if vars_path == "vars" else display
                arrays += [budget.read(vars_group[k]) for k in sorted(vars_group.keys(), key=int)]
        if not arrays:
            continue
        kind = _strip_counter(name)
        match = re.search(r"_(\d+)$", name)
        index = int(match.group(1)) if match else 0
        kind_configs = configs.get(kind, [])
        config = kind_configs[index] if index < len(kind_configs) else {}
        names = variable_names(kind, len(arrays), config)
        layers.append(KerasLayerWeights(str(config.get("name", display)), path, kind,
                                        dict(zip(names, arrays)), config))
    return layers


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _guess_kind(layer_name: str, weights: dict[str, Any]) -> str:
    names = set(weights)
    if {"depthwise_kernel", "pointwise_kernel"} <= names:
        return "separable_conv2d"
    if "moving_mean" in names:
        return "batch_normalization"
    if "embeddings" in names:
        return "embedding"
    if "recurrent_kernel" in names:
        kernel, recurrent = weights["kernel"], weights["recurrent_kernel"]
        return "lstm" if kernel.shape[-1] == 4 * recurrent.shape[0] else "gru"
    if "gamma" in names or "beta" in names:
        return "layer_normalization"
    if "kernel" in names:
        rank = weights["kernel"].ndim
        if "depthwise" in layer_name:
            return "depthwise_conv2d"
        return {2: "dense", 3: "conv1d", 4: "conv2d", 5: "conv3d"}.get(rank, "unknown")
    return "unknown"


def _read_legacy(root: Any, configs: dict[str, list[dict[str, Any]]], budget: _ReadBudget) -> list[KerasLayerWeights]:
    config_by_name = {c.get("name"): (kind, c) for kind, cs in configs.items() for c in cs}
    layers: list[KerasLayerWeights] = []
    for layer_name in (_decode(n) for n in root.attrs.get("layer_names", [])):
        group = root[layer_name]
        weights: dict[str, Any] = {}
        for weight_name in (_decode(n) for n in group.attrs.get("weight_names", [])):
            short = weight_name.split("/")[-1].split(":")[0]
            weights[short] = budget.read(group[weight_name])
        if not weights:
            continue
        kind, config = config_by_name.get(layer_name, (None, {}))
        layers.append(KerasLayerWeights(layer_name, f"model_weights/{layer_name}",
                                        kind or _guess_kind(layer_name, weights), weights, config))
    return layers
