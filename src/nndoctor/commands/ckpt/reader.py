"""Opening any supported checkpoint file safely, by its content rather than its name.

Order of operations for pickle-based files: scan the opcodes for globals (pickle_scan), then
read with the inert unpickler (safe_unpickle): allowlisted names resolve, every other global
becomes a placeholder, nothing the file names is imported or called, and allocations are
bounded (limits.py). ``--trust`` is the only way to let the pickle run. Damaged files raise
UsageError with a clear message, never a traceback; a damaged file that also names unsafe
globals is still returned (read_mode "not-loaded") so that C104 is reported.
"""

from __future__ import annotations

import io
import os
import pickle
import stat
import tarfile
import zipfile
from typing import Any

from nndoctor.commands.ckpt.allowlist import is_allowed
from nndoctor.commands.ckpt.checkpoint import Checkpoint, StateDict
from nndoctor.commands.ckpt.containers import ContainerWalk
from nndoctor.commands.ckpt.embedded import (
    NPY_MAGIC,
    EmbeddedPickle,
    check_zip_sizes,
    hdf5_pickles,
    npy_header,
    npy_pickle,
    scan_bytes,
    tar_pickles,
    zip_pickles,
)
from nndoctor.commands.ckpt.pickle_scan import PickleCorrupt, looks_like_pickle, scan_pickle
from nndoctor.commands.ckpt.safe_unpickle import inert_load_pickle, inert_torch_load
from nndoctor.util.errors import UsageError
from nndoctor.util.limits import ReadLimits

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
ZIP_MAGIC = b"PK\x03\x04"
_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _regular_file(path: str) -> int:
    """The size of ``path``; refuse anything but a regular file (FIFOs and devices never end)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except OSError as error:
        raise UsageError(f"{path}: cannot read it ({error.strerror})") from None
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{path}: is a directory, not a checkpoint file")
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{path}: not a regular file (a FIFO, socket or device): not read")
    return info.st_size


def _is_tar(path: str, head: bytes) -> bool:
    """A tar archive, including old V7 headers without the "ustar" magic: torch.load tries
    tarfile.open on any legacy file, so a pickle/tar polyglot must be handled as a tar."""
    if len(head) >= 262 and head[257:262] == b"ustar":
        return True
    try:
        with tarfile.open(path, mode="r:"):
            return True
    except (tarfile.TarError, OSError, ValueError):
        return False


def sniff_format(path: str) -> str:
    """The container format from the first bytes: zip, hdf5, safetensors, npy, tar or pickle."""
    size = _regular_file(path)
    if size == 0:
        raise UsageError(f"{path}: empty file (0 bytes) — the save was interrupted or never happened")
    with open(path, "rb") as handle:
        head = handle.read(512)
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if head.startswith(HDF5_MAGIC):
        return "hdf5"
    if head.startswith(NPY_MAGIC):
        return "npy"
    if _is_tar(path, head):
        return "tar"
    # safetensors before pickle: its 8-byte header length may well start with 0x80.
    if len(head) >= 9 and head[8:9] == b"{" and head[6:8] == b"\x00\x00":
        header_len = int.from_bytes(head[:8], "little")
        if header_len + 8 <= size:
            return "safetensors"
        raise UsageError(f"{path}: truncated safetensors file: header says {header_len} bytes, "
                         f"file has {size}")
    if looks_like_pickle(head):
        if head[:1] == b"\x80":
            return "pickle"
        # Protocol 0/1 pickles are text: only a scan tells them from other text files.
        try:
            scan_pickle(_read_all(path))
            return "pickle"
        except PickleCorrupt as error:
            if error.found.names:
                return "pickle"
    raise UsageError(f"{path}: not a recognised checkpoint (PyTorch zip/pickle, safetensors, "
                     f"Keras HDF5 or .keras, .npy/.npz, TensorFlow checkpoint or SavedModel); first bytes {head[:8]!r}")


def read_checkpoint(path: str, *, trust: bool = False, limits: ReadLimits | None = None) -> Checkpoint:
    """Read ``path`` without executing anything it contains (unless ``trust``)."""
    path = os.fspath(path)
    limits = limits or ReadLimits.from_env()
    from nndoctor.commands.ckpt.remote import is_url

    if is_url(path):  # s3://, gs://: read in place with ranged reads
        from nndoctor.commands.ckpt.remote import read_remote_checkpoint

        # torch.save's zip over a URL is read by the same inert zip reader (handed over, so that
        # remote.py need not import this module back)
        return read_remote_checkpoint(path, read_zip=_read_zip)
    tf_checkpoint = _tf_location(path)
    if tf_checkpoint is not None:
        from nndoctor.commands.ckpt.tf_checkpoint import read_tf_checkpoint

        return read_tf_checkpoint(path, tf_checkpoint)
    kind = sniff_format(path)
    if kind == "safetensors":
        return _read_safetensors(path)
    if kind == "hdf5":
        return _keras_with_embedded(path, _hdf5_file_pickles(path))
    if kind == "npy":
        return _read_npy(path)
    if kind == "tar":
        return _read_tar(path, limits)
    if kind == "zip":
        return _read_zip(path, trust, limits)
    return _read_raw_pickle(path, trust, limits)


def _tf_location(path: str) -> Any:
    """Where the TensorFlow bundle named by ``path`` is (prefix, .index, shard, folder), or None."""
    from nndoctor.commands.ckpt.tf_bundle import LocalFiles
    from nndoctor.commands.ckpt.tf_checkpoint import locate

    is_dir = os.path.isdir(path)
    location = locate(path, LocalFiles(), is_dir)
    if location is None and is_dir:
        try:
            prefixes = sorted(name[: -len(".index")] for name in os.listdir(path) if name.endswith(".index"))
        except OSError:
            prefixes = []
        if prefixes:  # tf.train.Checkpoint.write() leaves no "checkpoint" state file
            shown = ", ".join(os.path.join(path, p) for p in prefixes[:5])
            raise UsageError(f"{path}: a folder of TensorFlow checkpoints without a 'checkpoint' state file; "
                             f"name one by its prefix: {shown}")
        versions = _saved_model_versions(path)
        if versions:  # TensorFlow Serving's model folder: one SavedModel per numbered version
            shown = ", ".join(versions[-5:])
            raise UsageError(f"{path}: a TensorFlow Serving model folder (SavedModel versions {shown}); "
                             f"name one version: {os.path.join(path, versions[-1])}")
    return location


def _saved_model_versions(path: str) -> list[str]:
    """Numbered subfolders holding a SavedModel, oldest first."""
    try:
        names = [name for name in os.listdir(path) if name.isdigit()]
    except OSError:
        return []
    return sorted((name for name in names if os.path.isfile(os.path.join(path, name, "saved_model.pb"))), key=int)


def _read_zip(path: str, trust: bool, limits: ReadLimits, *, stream: Any = None, size: int | None = None) -> Checkpoint:
    """``stream``: an open file of an object store (read in place, ranged); ``path`` names it."""
    size = os.path.getsize(path) if size is None else size
    try:
        with zipfile.ZipFile(stream if stream is not None else path) as archive:
            names = archive.namelist()
            if "config.json" in names and "model.weights.h5" in names:
                if stream is not None:
                    raise UsageError(f"{path}: a .keras archive: over a URL, copy it to a local file first")
                check_zip_sizes(path, archive, size, limits)
                embedded = zip_pickles(path, archive, limits, skip={"model.weights.h5"})
                embedded += _hdf5_bytes_pickles(archive.read("model.weights.h5"))
                return _keras_with_embedded(path, embedded)
            pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
            if not pkl:
                if names and all(n.endswith(".npy") for n in names):
                    return _read_npz(path, archive, limits)
                embedded = zip_pickles(path, archive, limits, skip=set())
                if embedded:
                    return _embedded_only(path, "zip", embedded)
                raise UsageError(f"{path}: a zip archive that is neither a PyTorch checkpoint "
                                 f"nor a .keras model (no data.pkl, no config.json)")
            check_zip_sizes(path, archive, size, limits)
            torchscript = any(n.endswith("/constants.pkl") or "/code/" in n for n in names)
            data = archive.read(pkl[0])
            extra = zip_pickles(path, archive, limits, skip={pkl[0]})
    except zipfile.BadZipFile as error:
        raise UsageError(f"{path}: truncated or corrupted zip checkpoint ({error}); "
                         f"re-save or re-download it") from None
    except (OSError, zipfile.LargeZipFile, EOFError, NotImplementedError) as error:
        raise UsageError(f"{path}: cannot read the archive: {error}") from None
    fmt = "torchscript" if torchscript else "pytorch-zip"
    main = scan_bytes(pkl[0], data)
    return _load_pickled(path, fmt, [main, *extra], trust, limits, stream=stream, size=size)


def _read_raw_pickle(path: str, trust: bool, limits: ReadLimits) -> Checkpoint:
    # Either the legacy torch format (several pickles, then raw bytes) or a plain pickle.dump.
    with open(path, "rb") as handle:
        data = handle.read()
    # torch's legacy format starts with its magic number pickled on its own (protocol 2).
    fmt = "pytorch-legacy" if data.startswith(pickle.dumps(_TORCH_LEGACY_MAGIC, protocol=2)) else "pickle"
    scanned = scan_bytes("(root)", data, max_pickles=5 if fmt == "pytorch-legacy" else 1)
    return _load_pickled(path, fmt, [scanned], trust, limits, raw=data)


def _unsafe(names: list[str]) -> list[str]:
    return [g for g in names if not is_allowed(g)]


def _all_globals(pickles: list[EmbeddedPickle]) -> list[str]:
    return list(dict.fromkeys(name for item in pickles for name in item.globals))


def _read_all(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _load_pickled(path: str, fmt: str, pickles: list[EmbeddedPickle], trust: bool,
                  limits: ReadLimits, raw: bytes | None = None, *, stream: Any = None,
                  size: int | None = None) -> Checkpoint:
    globals_ = _all_globals(pickles)
    unsafe = _unsafe(globals_)
    ckpt = Checkpoint(path=path, format=fmt, globals=globals_, unsafe_globals=unsafe)
    for item in pickles[1:]:
        if _unsafe(item.globals):
            ckpt.other_entries[f"[member {item.where}]"] = "pickle naming " + ", ".join(_unsafe(item.globals))
    main = pickles[0]
    if main.error is not None:
        if unsafe:  # hostile and broken: still report it as hostile
            ckpt.read_mode = "not-loaded"
            ckpt.other_entries["(root)"] = f"not loaded: {main.error}"
            return ckpt
        raise UsageError(f"{path}: corrupted checkpoint: {main.error}")
    if fmt == "torchscript":
        ckpt.read_mode = "not-loaded"
        ckpt.other_entries["(root)"] = "TorchScript archive: load it with torch.jit.load"
        return ckpt
    try:
        if trust:
            ckpt.read_mode = "trusted"
            ckpt.root = _trusted_load(path, fmt)
        else:
            ckpt.read_mode = "placeholders" if unsafe else "weights_only"
            # Raw pickles are read from memory: a file object's read(n) would reserve the n
            # bytes a length field declares before finding out the file is shorter.
            if fmt == "pickle":
                ckpt.root = inert_load_pickle(io.BytesIO(raw if raw is not None else _read_all(path)), limits)
            elif fmt == "pytorch-legacy":
                data = raw if raw is not None else _read_all(path)
                ckpt.root = inert_torch_load(io.BytesIO(data), limits, size=len(data))
            else:
                if stream is not None:  # an object store: torch reads each record with ranged reads
                    stream.seek(0)
                    ckpt.root = inert_torch_load(stream, limits, size=size or 0)
                else:
                    ckpt.root = inert_torch_load(path, limits, size=os.path.getsize(path), mmap=True)
    except UsageError:
        raise
    except (Exception, RecursionError) as error:  # noqa: BLE001 - any failure reading an untrusted file is reported, not raised
        reason = f"{type(error).__name__}: {error}"
        if unsafe:
            ckpt.read_mode = "not-loaded"
            ckpt.other_entries["(root)"] = f"not loaded: {reason}"
            return ckpt
        raise UsageError(f"{path}: could not read the checkpoint's tensors ({reason}); the file is "
                         f"truncated, corrupted or hostile") from None
    walk = ContainerWalk(limits)
    walk.walk(ckpt.root)
    ckpt.state_dicts = walk.state_dicts
    ckpt.whole_model_at = walk.whole_model_at
    ckpt.other_entries.update(walk.other_entries)
    return ckpt


def _embedded_only(path: str, fmt: str, pickles: list[EmbeddedPickle]) -> Checkpoint:
    globals_ = _all_globals(pickles)
    ckpt = Checkpoint(path=path, format=fmt, globals=globals_, unsafe_globals=_unsafe(globals_),
                      read_mode="not-loaded")
    for item in pickles:
        state = f"unreadable pickle ({item.error})" if item.error else "pickle"
        named = ", ".join(item.globals) if item.globals else "no globals"
        ckpt.other_entries[f"[member {item.where}]"] = f"{state} naming {named}"
    return ckpt


def _with_embedded(ckpt: Checkpoint, pickles: list[EmbeddedPickle]) -> Checkpoint:
    ckpt.globals = list(dict.fromkeys([*ckpt.globals, *_all_globals(pickles)]))
    ckpt.unsafe_globals = list(dict.fromkeys([*ckpt.unsafe_globals, *_unsafe(ckpt.globals)]))
    for item in pickles:
        ckpt.other_entries[f"[attribute {item.where}]"] = "pickle naming " + (", ".join(item.globals) or "no globals")
    return ckpt


def _keras_with_embedded(path: str, embedded: list[EmbeddedPickle]) -> Checkpoint:
    """The Keras weights plus any pickles hidden in the file; hostile pickles win over read errors."""
    try:
        ckpt = _read_keras(path)
    except UsageError:
        if any(_unsafe(item.globals) for item in embedded):
            return _embedded_only(path, "hdf5", embedded)
        raise
    return _with_embedded(ckpt, embedded)


def _hdf5_bytes_pickles(data: bytes) -> list[EmbeddedPickle]:
    try:
        import h5py

        with h5py.File(io.BytesIO(data), "r") as handle:
            return hdf5_pickles(handle)
    except Exception:  # noqa: BLE001 - unreadable HDF5 is reported by the Keras reader
        return []


def _hdf5_file_pickles(path: str) -> list[EmbeddedPickle]:
    try:
        import h5py

        with h5py.File(path, "r") as handle:
            return hdf5_pickles(handle)
    except Exception:  # noqa: BLE001 - unreadable HDF5 is reported by the Keras reader
        return []


def _read_npy(path: str) -> Checkpoint:
    import numpy as np

    with open(path, "rb") as handle:
        embedded = npy_pickle("(root)", handle)
    if embedded is not None:
        return _embedded_only(path, "npy", [embedded])
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as error:  # noqa: BLE001 - numpy raises many types on a corrupted file: reported as usage error
        raise UsageError(f"{path}: corrupted .npy file ({error})") from None
    return Checkpoint(path=path, format="npy", state_dicts=[StateDict("", {"(array)": array})],
                      read_mode="tensors-only")


def _read_npz(path: str, archive: zipfile.ZipFile, limits: ReadLimits) -> Checkpoint:
    """Shapes and dtypes from each member's header; object arrays are scanned, never loaded."""
    embedded = zip_pickles(path, archive, limits, skip=set())
    if embedded:
        ckpt = _embedded_only(path, "npz", embedded)
    else:
        ckpt = Checkpoint(path=path, format="npz", read_mode="tensors-only")
    arrays: dict[str, Any] = {}
    for info in archive.infolist():
        with archive.open(info) as handle:
            try:
                shape, dtype = npy_header(handle)
            except Exception:  # noqa: BLE001 - numpy raises ValueError/SyntaxError/… for bad headers: skip the member
                continue
        if not dtype.hasobject:
            arrays[info.filename[:-4]] = _ArrayHeader(shape, str(dtype))
    if arrays:
        ckpt.state_dicts.append(StateDict("", arrays))
    return ckpt


class _ArrayHeader:
    """Shape and dtype of an array that was not read (numpy .npz member)."""

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, dtype


def _read_tar(path: str, limits: ReadLimits) -> Checkpoint:
    """torch's pre-1.6 tar format is scanned, never loaded: its loader allocates sizes the file declares."""
    pickles = tar_pickles(path, limits)
    if not pickles:
        raise UsageError(f"{path}: a tar archive that is not a PyTorch checkpoint")
    ckpt = _embedded_only(path, "pytorch-tar", pickles)
    ckpt.other_entries["(root)"] = ("legacy tar checkpoint: scanned, not loaded; re-save it with a "
                                    "current torch.save if you trust it")
    return ckpt


def _trusted_load(path: str, fmt: str) -> Any:
    import torch

    if fmt == "pickle":
        with open(path, "rb") as handle:
            return pickle.load(handle)  # noqa: S301 - the user passed --trust
    return torch.load(path, map_location="cpu", weights_only=False)


def _read_safetensors(path: str) -> Checkpoint:
    from safetensors import safe_open

    try:
        import torch  # noqa: F401 - only to know whether torch tensors can be made

        framework = "pt"
    except ImportError:  # a TensorFlow/Keras-only installation: numpy arrays (no bfloat16)
        framework = "numpy"
    try:
        with safe_open(path, framework=framework) as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types on corrupted files: reported
        raise UsageError(f"{path}: corrupted or truncated safetensors file ({error})") from None
    return Checkpoint(path=path, format="safetensors", root=tensors,
                      state_dicts=[StateDict("", tensors)], metadata=metadata,
                      read_mode="tensors-only")


def _read_keras(path: str) -> Checkpoint:
    from nndoctor.commands.ckpt.keras_weights import read_keras_file

    try:
        fmt, layers, config = read_keras_file(path)
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure reading an untrusted file is reported, not raised
        raise UsageError(f"{path}: corrupted or unreadable Keras file ({type(error).__name__}: "
                         f"{error})") from None
    tensors = {f"{layer.name}/{name}": array for layer in layers for name, array in layer.weights.items()}
    ckpt = Checkpoint(path=path, format=fmt, root=None, state_dicts=[StateDict("", tensors)],
                      read_mode="tensors-only", keras_layers=layers)
    if config:
        ckpt.metadata["keras_model_class"] = config.get("class_name", "?")
    return ckpt
