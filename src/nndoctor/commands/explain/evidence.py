"""Evidence gathered on the crash path from the live run: which module, which tensors, which objects.

Everything here runs once, after the user's script has raised (never on a successful run),
and reads the traceback's frames and the engine's crash context. Nothing is kept: the
functions return names, shapes and numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from nndoctor.commands.explain.crash import Crash
from nndoctor.run.crash_context import crash_context

_PREFERRED_ROOT_NAMES = ("model", "net", "network", "module")


def describe_tensor(value: Any) -> str | None:
    """``float32[4, 3]@cpu`` for a tensor, None for anything else."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not isinstance(value, torch.Tensor):
        return None
    return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}@{value.device}"


def live_objects(crash: Crash, predicate: Callable[[Any], bool]) -> Iterator[tuple[str, Any]]:
    """(name, object) pairs from the traceback's frames, innermost first: locals of every
    frame, then the globals of the user's frames (the script's top-level variables)."""
    frames = list(reversed(crash.live_frames()))
    seen: set[tuple[str, int]] = set()
    for frame in frames:
        for name, value in list(frame.f_locals.items()):
            if (name, id(value)) not in seen and _safe(predicate, value):
                seen.add((name, id(value)))
                yield name, value
    from nndoctor.core.user_code import is_internal_frame

    for frame in frames:
        if is_internal_frame(frame):
            continue
        for name, value in list(frame.f_globals.items()):
            if not name.startswith("__") and (name, id(value)) not in seen and _safe(predicate, value):
                seen.add((name, id(value)))
                yield name, value


def _safe(predicate: Callable[[Any], bool], value: Any) -> bool:
    try:
        return bool(predicate(value))
    except Exception:  # noqa: BLE001 - user objects may refuse inspection
        return False


def crash_module(crash: Crash) -> Any:
    """The innermost module that was executing when the error was raised (weakly held)."""
    ref = crash.module_ref
    if ref is None and crash.session is not None:
        record = crash_context(crash.session)
        ref = record.module if record is not None else None
    return ref() if callable(ref) else None


def module_context_from_traceback(error: BaseException) -> tuple[dict[str, Any], Any, Any] | None:
    """The engine's crash-context fields, read from the traceback itself: torch's
    ``Module._call_impl`` frames hold each module being called (``self``) and its ``args``.
    Returns (context, weakref to the innermost module, weakref to the outermost) or None."""
    import weakref

    try:
        import torch.nn as nn
    except ImportError:  # pragma: no cover
        return None
    from nndoctor.instrument.stats import describe_structure

    calls: list[tuple[Any, tuple]] = []
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "_call_impl" and frame.f_code.co_filename.endswith("module.py"):
            module = frame.f_locals.get("self")
            if isinstance(module, nn.Module):
                calls.append((module, frame.f_locals.get("args", ())))
        tb = tb.tb_next
    if not calls:
        return None
    root, (inner, args) = calls[0][0], calls[-1]
    names = {id(m): n for n, m in root.named_modules()}
    path = [names.get(id(m), type(m).__name__) for m, _ in calls if id(m) in names]
    params = {
        name: f"{str(p.dtype).replace('torch.', '')}{list(p.shape)}@{p.device}"
        for name, p in list(inner.named_parameters(recurse=False))[:8]
    }
    context = {
        "module_path": path,
        "module_qualname": names.get(id(inner), type(inner).__name__),
        "module_type": type(inner).__name__,
        "root_type": type(root).__name__,
        "inputs": describe_structure(args),
        "parameters": params,
        "training": inner.training,
    }
    return context, weakref.ref(inner), weakref.ref(root)


def root_variable(crash: Crash) -> tuple[str, Any] | None:
    """The user's name for the model that contains the crashing module (``model``, ``net``),
    found in the crashing frames' locals or the script's globals; ``self`` is skipped."""
    inner = crash_module(crash)
    root = crash.root_ref() if callable(crash.root_ref) else None
    root_type = crash.context.get("root_type")
    if inner is None and root is None:
        return None
    try:
        import torch.nn as nn
    except ImportError:  # pragma: no cover
        return None

    def is_root(value: Any) -> bool:
        if root is not None:
            return value is root
        return (isinstance(value, nn.Module) and type(value).__name__ == root_type
                and any(m is inner for m in value.modules()))

    candidates = [(name, value) for name, value in live_objects(crash, is_root) if name != "self"]
    if not candidates:
        return None
    candidates.sort(key=lambda item: (item[0] not in _PREFERRED_ROOT_NAMES,))
    return candidates[0]


def module_display_name(crash: Crash) -> str | None:
    """``model.layer3.1.conv2``: the user's variable for the model plus the module's path in it.

    Falls back to the model's class name (``ResNet.layer3.1.conv2``) when no variable holds
    the model; None when the crash did not happen inside a module.
    """
    context = crash.context
    if not context or "module_qualname" not in context:
        return None
    qualname = context.get("module_qualname") or ""
    found = root_variable(crash) if crash.is_live else None
    root = found[0] if found else context.get("root_type", "model")
    return f"{root}.{qualname}" if qualname else root


def module_label(crash: Crash) -> str | None:
    """``model.bn1 (BatchNorm1d)``, or None when no module was running."""
    name = module_display_name(crash)
    if not name:
        return None
    kind = crash.context.get("module_type")
    return f"{name} ({kind})" if kind and not name.endswith(kind) else name


def module_phrase(crash: Crash) -> str:
    """``in model.fc (Linear)`` for messages, or '' when no module was running."""
    label = module_label(crash)
    return f" in {label}" if label else ""


def context_inputs(crash: Crash) -> list[str]:
    """The crashing module's positional inputs as ``dtype[shape]@device`` strings."""
    inputs = crash.context.get("inputs")
    if isinstance(inputs, (list, tuple)):
        return [i for i in inputs if isinstance(i, str)]
    return []


def parse_described_shape(text: str) -> list[int] | None:
    """``float32[4, 3, 32, 32]@cpu`` -> [4, 3, 32, 32]."""
    import re

    match = re.search(r"\[([\d,\s]*)\]", text or "")
    if not match:
        return None
    return [int(p) for p in match.group(1).split(",") if p.strip()]


def functional_arguments(crash: Crash, functions: tuple[str, ...]) -> dict[str, Any] | None:
    """Locals of the innermost ``torch.nn.functional`` frame among ``functions`` (a loss's
    input and target, for instance), live crashes only."""
    for function in functions:
        found = crash.frame_locals(function, "functional")
        if found is not None:
            found["__function__"] = function
            return found
    return None


def integer_range(tensor: Any) -> tuple[int, int] | None:
    """(min, max) of an integer tensor on the CPU (crash path: the sync is allowed;
    CUDA tensors are skipped because after a device-side assert every CUDA call fails)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0 or tensor.is_floating_point():
        return None
    if tensor.device.type != "cpu":
        return None
    return int(tensor.min()), int(tensor.max())
