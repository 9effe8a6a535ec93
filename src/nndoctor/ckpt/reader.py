"""Opening any supported checkpoint file safely, by its content rather than its name.

Order of operations for pickle-based files: scan the opcodes for globals (pickle_scan), and
only if every global is on torch's weights_only allowlist load with ``weights_only=True``.
Otherwise the file is read with inert placeholders (safe_unpickle) unless the user passed
``--trust``. Damaged files raise UsageError with a clear message, never a traceback.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from typing import Any

from nndoctor.ckpt.checkpoint import Checkpoint, StateDict
from nndoctor.ckpt.containers import ContainerWalk
from nndoctor.ckpt.pickle_scan import PickleCorrupt, scan_pickle
from nndoctor.ckpt.safe_unpickle import (
    PlaceholderUnpickler,
    allowed_globals,
    is_allowed,
    load_with_placeholders,
)
from nndoctor.errors import UsageError

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
ZIP_MAGIC = b"PK\x03\x04"
_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def sniff_format(path: str) -> str:
    """The container format from the first bytes: zip, hdf5, safetensors or pickle."""
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a directory, not a checkpoint file")
    size = os.path.getsize(path)
    if size == 0:
        raise UsageError(f"{path}: empty file (0 bytes) — the save was interrupted or never happened")
    with open(path, "rb") as handle:
        head = handle.read(16)
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if head.startswith(HDF5_MAGIC):
        return "hdf5"
    # safetensors before pickle: its 8-byte header length may well start with 0x80.
    if len(head) >= 9 and head[8:9] == b"{" and head[6:8] == b"\x00\x00":
        header_len = int.from_bytes(head[:8], "little")
        if header_len + 8 <= size:
            return "safetensors"
        raise UsageError(f"{path}: truncated safetensors file: header says {header_len} bytes, "
                         f"file has {size}")
    if head[:1] == b"\x80":
        return "pickle"
    raise UsageError(f"{path}: not a recognised checkpoint (PyTorch zip/pickle, safetensors, "
                     f"Keras HDF5 or .keras); first bytes {head[:8]!r}")


def read_checkpoint(path: str, *, trust: bool = False) -> Checkpoint:
    """Read ``path`` without executing anything it contains (unless ``trust``)."""
    path = os.fspath(path)
    kind = sniff_format(path)
    if kind == "safetensors":
        return _read_safetensors(path)
    if kind == "hdf5":
        return _read_keras(path)
    if kind == "zip":
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
                if "config.json" in names and "model.weights.h5" in names:
                    return _read_keras(path)
                pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
                if not pkl:
                    raise UsageError(f"{path}: a zip archive that is neither a PyTorch checkpoint "
                                     f"nor a .keras model (no data.pkl, no config.json)")
                torchscript = any(n.endswith("/constants.pkl") or "/code/" in n for n in names)
                data = archive.read(pkl[0])
        except zipfile.BadZipFile as error:
            raise UsageError(f"{path}: truncated or corrupted zip checkpoint ({error}); "
                             f"re-save or re-download it") from None
        except (OSError, zipfile.LargeZipFile, EOFError) as error:
            raise UsageError(f"{path}: cannot read the archive: {error}") from None
        globals_ = _scan(path, data, max_pickles=1)
        fmt = "torchscript" if torchscript else "pytorch-zip"
        return _load_pickled(path, fmt, globals_, trust)
    # A bare pickle: either the legacy torch format (several pickles, then raw bytes) or
    # a plain pickle.dump of some object.
    with open(path, "rb") as handle:
        data = handle.read()
    fmt = "pickle"
    try:
        first = PlaceholderUnpickler(io.BytesIO(data)).load()
        if first == _TORCH_LEGACY_MAGIC:
            fmt = "pytorch-legacy"
    except Exception:
        pass  # the scan below gives the precise error
    globals_ = _scan(path, data, max_pickles=5 if fmt == "pytorch-legacy" else 1)
    return _load_pickled(path, fmt, globals_, trust)


def _scan(path: str, data: bytes, *, max_pickles: int) -> list[str]:
    try:
        found, _count = scan_pickle(data, max_pickles=max_pickles)
    except PickleCorrupt as error:
        raise UsageError(f"{path}: corrupted checkpoint: {error}") from None
    return found.names


def _load_pickled(path: str, fmt: str, globals_: list[str], trust: bool) -> Checkpoint:
    allowed = allowed_globals()
    unsafe = [g for g in globals_ if not is_allowed(g, allowed)]
    ckpt = Checkpoint(path=path, format=fmt, globals=globals_, unsafe_globals=unsafe)
    if fmt == "torchscript":
        ckpt.read_mode = "not-loaded"
        ckpt.other_entries["(root)"] = "TorchScript archive: load it with torch.jit.load"
        return ckpt
    try:
        if trust:
            ckpt.read_mode = "trusted"
            ckpt.root = _trusted_load(path, fmt)
        elif unsafe:
            ckpt.read_mode = "placeholders"
            ckpt.root = _placeholder_load(path, fmt)
        else:
            import torch

            ckpt.read_mode = "weights_only"
            ckpt.root = torch.load(path, map_location="cpu", weights_only=True,
                                   mmap=fmt == "pytorch-zip")
    except UsageError:
        raise
    except Exception as error:
        raise UsageError(f"{path}: could not read the checkpoint's tensors "
                         f"({type(error).__name__}: {error}); the file is probably truncated or "
                         f"corrupted") from None
    walk = ContainerWalk()
    walk.walk(ckpt.root)
    ckpt.state_dicts = walk.state_dicts
    ckpt.whole_model_at = walk.whole_model_at
    ckpt.other_entries.update(walk.other_entries)
    return ckpt


def _trusted_load(path: str, fmt: str) -> Any:
    import torch

    if fmt == "pickle":
        with open(path, "rb") as handle:
            return pickle.load(handle)  # noqa: S301 - the user passed --trust
    return torch.load(path, map_location="cpu", weights_only=False)


def _placeholder_load(path: str, fmt: str) -> Any:
    if fmt == "pickle":
        with open(path, "rb") as handle:
            return PlaceholderUnpickler(handle).load()
    return load_with_placeholders(path)


def _read_safetensors(path: str) -> Checkpoint:
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as error:
        raise UsageError(f"{path}: corrupted or truncated safetensors file ({error})") from None
    return Checkpoint(path=path, format="safetensors", root=tensors,
                      state_dicts=[StateDict("", tensors)], metadata=metadata,
                      read_mode="tensors-only")


def _read_keras(path: str) -> Checkpoint:
    from nndoctor.ckpt.keras_weights import read_keras_file

    try:
        fmt, layers, config = read_keras_file(path)
    except UsageError:
        raise
    except Exception as error:
        raise UsageError(f"{path}: corrupted or unreadable Keras file ({type(error).__name__}: "
                         f"{error})") from None
    tensors = {f"{layer.name}/{name}": array for layer in layers for name, array in layer.weights.items()}
    ckpt = Checkpoint(path=path, format=fmt, root=None, state_dicts=[StateDict("", tensors)],
                      read_mode="tensors-only", keras_layers=layers)
    if config:
        ckpt.metadata["keras_model_class"] = config.get("class_name", "?")
    return ckpt
