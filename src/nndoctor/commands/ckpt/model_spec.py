"""``--model MODULE:CALLABLE``: import the user's code and build their model.

``MODULE`` is a dotted module name (``pkg.models:Net``) importable from the current
directory, or a path to a Python file (``models/resnet.py:build``). The callable is called
with no arguments. This runs the user's own code, never anything from a checkpoint.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from nndoctor.util.errors import UsageError


def _import_target(module_part: str) -> Any:
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        path = os.path.abspath(module_part)
        if not os.path.isfile(path):
            raise UsageError(f"--model: no such file {module_part!r}")
        name = "nndoctor_user_" + os.path.splitext(os.path.basename(path))[0]
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # so the file's own sibling imports resolve
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"--model: cannot import {module_part!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(module_part)


def build_from_spec(spec: str, *, option: str = "--model") -> Any:
    """Import ``MODULE:CALLABLE`` and return ``CALLABLE()``."""
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise UsageError(f"{option} expects MODULE:CALLABLE (e.g. models.py:build), got {spec!r}")
    try:
        module = _import_target(module_part)
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - importing the user's module runs their code: any error is reported
        raise UsageError(f"{option}: importing {module_part!r} failed: {type(error).__name__}: {error}") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UsageError(f"{option}: {module_part!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"{option}: {spec!r} is not callable")
    try:
        return target()
    except Exception as error:  # noqa: BLE001 - calling the user's model factory runs their code: any error is reported
        raise UsageError(f"{option}: calling {spec!r} failed: {type(error).__name__}: {error}") from None


def build_torch_model(spec: str) -> Any:
    import torch

    model = build_from_spec(spec, option="--model")
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"--model {spec!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model
