"""``ckpt inspect`` on object-store URLs (``s3://``, ``gs://`` and other fsspec protocols).

The checkpoint is read in place with ranged reads: a TensorFlow bundle's index, then each
tensor's bytes at its offset; a safetensors file's header, then each tensor's byte range; a
PyTorch zip checkpoint through the same inert reader as local files, on a file object whose
reads are ranged GETs (the zip directory, the pickle, then each storage record).
Nothing is downloaded to disk. Credentials and endpoints come from the protocol's usual
environment (``AWS_*`` variables, ``~/.aws``, ``FSSPEC_S3_ENDPOINT_URL`` …). fsspec and the
protocol's package (s3fs for ``s3://``: ``pip install 'nndoctor[s3]'``) are imported only here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from nndoctor.commands.ckpt.checkpoint import Checkpoint, StateDict
from nndoctor.commands.ckpt.tf_bundle import bfloat16_array
from nndoctor.util.errors import UsageError

_URL = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*)://")
_PACKAGES = {"s3": "s3fs (pip install 'nndoctor[s3]')", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
             "abfs": "adlfs"}
_MAX_SAFETENSORS_HEADER = 100 << 20
# safetensors dtype names -> numpy
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "I64": "int64", "I32": "int32",
                       "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16",
                       "U8": "uint8", "BOOL": "bool", "BF16": "uint16"}  # BF16: bits, decoded below


def is_url(path: str) -> bool:
    """A URL for fsspec (``s3://bucket/key``); local paths and ``file://`` are read directly."""
    match = _URL.match(path)
    return match is not None and match.group("scheme").lower() != "file"


class RemoteFiles:
    """ByteSource over an fsspec file system: sizes from metadata, bytes by ranged reads."""

    def __init__(self, url: str) -> None:
        scheme = url.split("://", 1)[0].lower()
        try:
            import fsspec
        except ImportError:
            raise UsageError(f"{url}: reading URLs needs fsspec and {_PACKAGES.get(scheme, 'its protocol package')}"
                             ) from None
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except ImportError:
            raise UsageError(f"{url}: reading {scheme}:// URLs needs {_PACKAGES.get(scheme, 'the fsspec package for ' + scheme)}"
                             ) from None
        except ValueError as error:  # an unknown protocol
            raise UsageError(f"{url}: {error}") from None
        self.url = url

    def size(self, name: str) -> int | None:
        try:
            info = self.fs.info(name)
        except FileNotFoundError:
            return None
        except Exception as error:  # noqa: BLE001 - object stores raise their own types (auth, network)
            raise _access_error(self.url, error) from None
        return int(info["size"]) if info.get("type") == "file" else None

    def is_dir(self, name: str) -> bool:
        try:
            return bool(self.fs.isdir(name))
        except Exception as error:  # noqa: BLE001 - object stores raise their own types (auth, network)
            raise _access_error(self.url, error) from None

    def read(self, name: str, offset: int, length: int) -> bytes:
        try:
            return bytes(self.fs.cat_file(name, start=offset, end=offset + length))
        except Exception as error:  # noqa: BLE001 - object stores raise their own types (auth, network)
            raise _access_error(self.url, error) from None


def _access_error(url: str, error: Exception) -> UsageError:
    return UsageError(f"{url}: cannot read it ({type(error).__name__}: {error}); check the URL and the "
                      f"credentials in the environment")


def read_remote_checkpoint(url: str, read_zip: Callable[..., Checkpoint]) -> Checkpoint:
    """A TensorFlow checkpoint/SavedModel or a safetensors file at ``url``, read in place."""
    from nndoctor.commands.ckpt.tf_checkpoint import locate, read_tf_checkpoint

    files = RemoteFiles(url)
    location = locate(files.root, files, files.is_dir(files.root))
    if location is not None:
        ckpt = read_tf_checkpoint(url, location, files)
        ckpt.metadata["prefix"] = f"{url.split('://', 1)[0]}://{location.prefix}"
        return ckpt
    size = files.size(files.root)
    if size is None:
        raise UsageError(f"{url}: no such object (nor a TensorFlow checkpoint prefix or folder)")
    head = files.read(files.root, 0, 16)
    if len(head) >= 9 and head[8:9] == b"{" and head[6:8] == b"\x00\x00":
        return _read_safetensors(url, files, size)
    if head.startswith(b"PK\x03\x04"):  # torch.save's zip: the same inert reader, on a ranged stream
        from nndoctor.util.limits import ReadLimits

        try:
            stream = files.fs.open(files.root, "rb", block_size=1 << 20, cache_type="readahead")
        except Exception as error:  # noqa: BLE001 - object stores raise their own types (auth, network)
            raise _access_error(url, error) from None
        with stream:
            return read_zip(url, False, ReadLimits.from_env(), stream=stream, size=size)
    raise UsageError(f"{url}: over a URL, ckpt inspect reads TensorFlow checkpoints, SavedModel folders, "
                     f".safetensors files and PyTorch zip checkpoints in place; for this format (first bytes {head[:8]!r}) copy it to a "
                     f"local file first")


def _read_safetensors(url: str, files: RemoteFiles, size: int) -> Checkpoint:
    header_length = int.from_bytes(files.read(files.root, 0, 8), "little")
    if header_length > min(size - 8, _MAX_SAFETENSORS_HEADER):
        raise UsageError(f"{url}: truncated safetensors file: header says {header_length} bytes, file has {size}")
    try:
        header: dict[str, Any] = json.loads(files.read(files.root, 8, header_length))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{url}: corrupted safetensors header ({error})") from None
    metadata = header.pop("__metadata__", None) or {}
    base = 8 + header_length
    tensors: dict[str, np.ndarray] = {}
    for name, spec in header.items():
        try:
            dtype = np.dtype(_SAFETENSORS_DTYPES[spec["dtype"]])
            shape = tuple(int(d) for d in spec["shape"])
            start, end = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"{url}: corrupted safetensors header entry {name!r}") from None
        count = int(np.prod(shape, dtype=np.int64))
        if end - start != count * dtype.itemsize or start < 0 or base + end > size:
            raise UsageError(f"{url}: safetensors tensor {name!r} ({list(shape)} {spec['dtype']}) does not fit "
                             f"its byte range {start}..{end} of a {size}-byte file")
        array = np.frombuffer(bytearray(files.read(files.root, base + start, end - start)), dtype=dtype)
        if spec["dtype"] == "BF16":
            array = bfloat16_array(array)
        tensors[name] = array.reshape(shape)
    return Checkpoint(path=url, format="safetensors", root=tensors, state_dicts=[StateDict("", tensors)],
                      metadata={str(k): v for k, v in metadata.items()}, read_mode="tensors-only")
