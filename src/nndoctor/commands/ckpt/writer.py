"""Writing a repaired or converted state dict: format by suffix, always atomic."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from typing import Any

from nndoctor.util.atomic import atomic_write_bytes
from nndoctor.util.errors import UsageError

SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")


def check_output_path(out: str, inputs: list[str]) -> None:
    if not out.endswith(SUFFIXES):
        raise UsageError(f"-o {out!r}: use a .safetensors, .pt, .pth, .bin or .ckpt file name")
    for path in inputs:
        if os.path.exists(out) and os.path.exists(path) and os.path.samefile(out, path):
            raise UsageError(f"-o {out!r} is the input file; nndoctor never modifies its input")
    check_writable_file(out, "-o")


def check_writable_file(path: str, option: str) -> None:
    """Fail early, in one line, when ``path`` cannot become a file: before any work is done."""
    if os.path.isdir(path):
        raise UsageError(f"{option} {path!r} is a directory; give a file name")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise UsageError(f"{option} {path!r} exists and is not a regular file")
    parent = os.path.dirname(os.path.abspath(path))
    # The nearest existing ancestor decides: missing folders are created, files block them.
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"{option} {path!r}: {parent!r} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path!r}: the folder {parent!r} is not writable")


def write_or_fail(path: str, write: Any, option: str) -> None:
    """Run ``write()`` and turn an OS error (disk full, permissions) into a one-line UsageError."""
    try:
        write()
    except OSError as error:
        raise UsageError(f"{option} {path!r}: cannot write ({error.strerror or error})") from None


def plain_tensors(tensors: Mapping[str, Any]) -> dict[str, Any]:
    """Detached, contiguous, unshared CPU tensors (Parameters become plain tensors)."""
    import torch

    result = {}
    for key, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(value)
        result[key] = value.detach().to("cpu").contiguous().clone()
    return result


def write_state_dict(out: str, tensors: Mapping[str, Any], *, container: Any = None,
                     metadata: dict[str, str] | None = None) -> None:
    """Save ``tensors`` to ``out``; for torch formats, inside ``container`` when given."""
    tensors = plain_tensors(tensors)
    if out.endswith(".safetensors"):
        from safetensors.torch import save

        data = save(tensors, metadata={k: str(v) for k, v in (metadata or {}).items()} or None)
    else:
        import torch

        buffer = io.BytesIO()
        torch.save(container if container is not None else tensors, buffer)
        data = buffer.getvalue()
    write_or_fail(out, lambda: atomic_write_bytes(out, data), "-o")


def replace_at(root: Any, where: str, value: Any) -> Any:
    """A copy of nested dict ``root`` with the entry at dotted path ``where`` replaced."""
    if not where:
        return value
    if not isinstance(root, Mapping):
        raise KeyError(where)
    head, _, rest = where.partition(".")
    if head not in root:
        raise KeyError(where)
    copy = dict(root)
    copy[head] = replace_at(root[head], rest, value)
    return copy
