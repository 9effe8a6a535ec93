"""TensorFlow checkpoints and SavedModel folders for ``nndoctor ckpt``.

Accepted spellings of one checkpoint: its prefix (``ckpt-1``), its ``ckpt-1.index``, a data
shard ``ckpt-1.data-00000-of-00001``, the folder holding the ``checkpoint`` state file (its
latest checkpoint), and a SavedModel folder (``saved_model.pb`` + ``variables/``). Only the
variables bundle is read (tf_bundle): the SavedModel's graph is never loaded, so none of its
functions can run.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

import numpy as np

from nndoctor.commands.ckpt.checkpoint import Checkpoint, StateDict
from nndoctor.commands.ckpt.keras_weights import KerasLayerWeights, _guess_kind
from nndoctor.commands.ckpt.tf_bundle import (
    OBJECT_GRAPH_KEY,
    TABLE_MAGIC,
    ByteSource,
    LocalFiles,
    TensorBundle,
)
from nndoctor.commands.ckpt.tf_objects import NamedVariable, name_variables, parse_object_graph
from nndoctor.util.errors import UsageError
from nndoctor.util.protowire import ProtoError

_SHARD = re.compile(r"^(?P<prefix>.+)\.data-\d{5}-of-\d{5}$")
_STATE_LINE = re.compile(r'^\s*model_checkpoint_path:\s*"(?P<path>(?:[^"\\]|\\.)*)"', re.MULTILINE)
_MAX_STATE_FILE = 1 << 20
_V1_FORMAT = ("a V1 checkpoint (one file, no .index: tf.train.Saver's format before TensorFlow 0.12): not "
              "supported; TensorFlow's tf.train.load_checkpoint reads it")


@dataclass
class TFLocation:
    prefix: str
    format: str  # tf-checkpoint or tf-savedmodel
    saved_model: str | None = None  # the SavedModel folder
    note: str | None = None  # how the state file's name was resolved, when not as written


def _join(folder: str, name: str) -> str:
    if "://" in folder:
        return folder.rstrip("/") + "/" + name
    return posixpath.join(folder, name) if "/" in folder else f"{folder}/{name}"


def locate(path: str, source: ByteSource, is_dir: bool) -> TFLocation | None:
    """The bundle a path names, or None when it is not a TensorFlow checkpoint spelling."""
    if is_dir:
        folder = path.rstrip("/") or "/"
        if source.size(_join(folder, "saved_model.pb")) is not None or \
                source.size(_join(folder, "saved_model.pbtxt")) is not None:
            prefix = _join(folder, "variables/variables")
            if source.size(prefix + ".index") is None:
                raise UsageError(f"{path}: a SavedModel without variables (no variables/variables.index): "
                                 f"nothing to inspect")
            return TFLocation(prefix, "tf-savedmodel", folder)
        state = _join(folder, "checkpoint")
        size = source.size(state)
        if size is None:
            return None
        text = source.read(state, 0, min(size, _MAX_STATE_FILE)).decode("utf-8", "replace")
        match = _STATE_LINE.search(text)
        if match is None:
            raise UsageError(f"{state}: a TensorFlow checkpoint state file without model_checkpoint_path")
        named = match.group("path")
        try:  # a text-format proto string: escapes such as \\ in Windows paths
            named = named.encode().decode("unicode_escape")
        except UnicodeDecodeError:
            pass
        # tf.train.CheckpointManager writes names relative to the folder; older savers absolute
        # ones, which go stale when the folder is copied elsewhere: then the same name beside the
        # state file is the checkpoint (TensorFlow itself would fail to find it).
        candidates = [named] if named.startswith("/") and "://" not in folder else []
        candidates += [_join(folder, posixpath.basename(named)), _join(folder, named)]
        for prefix in candidates:
            if source.size(prefix + ".index") is not None:
                stale = named.startswith("/") and prefix != named
                note = f"the state file names {named!r}, not found there; read the same name beside it" if stale else None
                return TFLocation(prefix, "tf-checkpoint", note=note)
        beside = _join(folder, posixpath.basename(named))
        if _is_v1_checkpoint(source, beside):
            raise UsageError(f"{state} names {named!r}, {_V1_FORMAT}")
        raise UsageError(f"{state} names checkpoint {named!r}, but {candidates[0]}.index does not exist")
    if not path.endswith(".index") and _is_v1_checkpoint(source, path):
        raise UsageError(f"{path}: {_V1_FORMAT}")
    if path.endswith(".index") and source.size(path) is not None:
        return TFLocation(path[: -len(".index")], "tf-checkpoint")
    shard = _SHARD.match(path)
    if shard and source.size(shard.group("prefix") + ".index") is not None:
        return TFLocation(shard.group("prefix"), "tf-checkpoint")
    if source.size(path) is None and source.size(path + ".index") is not None:
        return TFLocation(path, "tf-checkpoint")
    return None


def _is_v1_checkpoint(source: ByteSource, path: str) -> bool:
    """A single-file V1 checkpoint: a LevelDB table (the tensor-slice format) with no .index beside it."""
    size = source.size(path)
    if size is None or size < 48 or source.size(path + ".index") is not None:
        return False
    return int.from_bytes(source.read(path, size - 8, 8), "little") == TABLE_MAGIC


def read_tf_checkpoint(path: str, location: TFLocation, source: ByteSource | None = None) -> Checkpoint:
    """The bundle's variables as a Checkpoint (model variables first, optimizer ones apart)."""
    source = source or LocalFiles()
    bundle = TensorBundle(location.prefix, source)
    ckpt = Checkpoint(path=path, format=location.format, read_mode="tensors-only")
    ckpt.metadata["prefix"] = location.prefix
    ckpt.metadata["data_shards"] = bundle.num_shards
    if location.note:
        ckpt.metadata["state_file"] = location.note
    if location.saved_model is not None:
        ckpt.other_entries["saved_model.pb"] = "graph and functions not loaded (only the variables are read)"
    named = _named(bundle)
    model: dict[str, np.ndarray] = {}
    optimizer: dict[str, np.ndarray] = {}
    metrics = 0
    for variable in named:
        entry = bundle.entries[variable.key]
        if entry.sliced:
            ckpt.other_entries[variable.name] = "partitioned variable: its slices are not read"
            continue
        if entry.dtype in ("string", "resource", "variant") or entry.dtype.startswith("dtype#"):
            ckpt.other_entries[variable.name] = f"{entry.dtype} tensor {list(entry.shape)}"
            continue
        if variable.role == "metric":
            metrics += 1
            continue
        array = bundle.read(variable.key)
        if variable.role == "counter":
            ckpt.other_entries["save_counter"] = str(array.item()) if array.size == 1 else str(list(array.shape))
        elif variable.role == "optimizer":
            optimizer[variable.name] = array
        else:
            model[variable.name] = array
    if metrics:
        ckpt.other_entries["keras_api/metrics"] = f"{metrics} metric variables (running totals, not weights)"
    if model:
        ckpt.state_dicts.append(StateDict("", model))
    if optimizer:
        ckpt.state_dicts.append(StateDict("optimizer", optimizer))
        ckpt.other_entries["optimizer"] = _optimizer_line(optimizer)
    ckpt.keras_layers = keras_layers(named, model)
    return ckpt


def _named(bundle: TensorBundle) -> list[NamedVariable]:
    keys = set(bundle.entries) - {OBJECT_GRAPH_KEY}
    if OBJECT_GRAPH_KEY not in bundle.entries:  # a TF1 Saver checkpoint: keys are variable names
        return [NamedVariable(k, k, k, "model") for k in sorted(keys)]
    try:
        nodes = parse_object_graph(bundle.read_strings(OBJECT_GRAPH_KEY)[0])
    except (ProtoError, IndexError) as error:
        raise UsageError(f"{bundle.index_path}: corrupted object graph ({error})") from None
    named = name_variables(nodes, keys)
    listed = {v.key for v in named}
    # Keys the graph does not name (slot variables, registered savers): shown under their key.
    named += [NamedVariable(k, k, "", "optimizer" if ".OPTIMIZER_SLOT" in k else "model")
              for k in sorted(keys - listed) if not k.startswith("_all_variables/")]  # export copies
    return named


def _optimizer_line(optimizer: dict[str, np.ndarray]) -> str:
    text = f"{len(optimizer)} optimizer variables"
    for name, value in optimizer.items():
        if value.size == 1 and name.rsplit("/", 1)[-1] in ("iteration", "iter", "iterations"):
            text += f", {name}={value.item()}"
    return text


def keras_layers(named: list[NamedVariable], model: dict[str, np.ndarray]) -> list[KerasLayerWeights]:
    """Layers grouped from Keras variable paths (``sequential/conv2d/kernel``), in model order;
    empty when the variables' own names are not distinct layer paths (a plain ``tf.Module``)."""
    variables = [v for v in named if v.role == "model" and v.name in model]
    full_names = [v.full_name for v in variables]
    if not variables or len(set(full_names)) != len(full_names) or not all("/" in f for f in full_names):
        return []
    groups: dict[str, dict[str, np.ndarray]] = {}
    for variable in variables:
        parent, _, leaf = variable.full_name.rpartition("/")
        groups.setdefault(parent, {})[leaf] = model[variable.name]
    layers = []
    for parent, weights in groups.items():
        name = parent.rsplit("/", 1)[-1]
        layers.append(KerasLayerWeights(name, parent, _guess_kind(name, weights), weights))
    if not any(layer.kind != "unknown" for layer in layers):
        return []
    return layers
