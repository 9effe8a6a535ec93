"""Finding the state dicts inside whatever object a checkpoint holds.

Checkpoints are rarely a bare state_dict: training loops save ``{"model": …, "optimizer": …,
"epoch": …}``, Lightning saves ``{"state_dict": …, "optimizer_states": […], …}``, and
``torch.save(model)`` pickles the module itself. This walks the object once and reports
every flat name->tensor mapping, plus a one-line summary of everything else.

The object comes from an untrusted file, so the walk is bounded: each container is visited once
(a few KB of pickle can reference one dict a billion times), and the number of objects and the
nesting depth are capped (limits.py).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from nndoctor.commands.ckpt.checkpoint import StateDict, TensorInfo
from nndoctor.commands.ckpt.safe_unpickle import OpaqueObject
from nndoctor.util.limits import ReadLimits

_MAX_DEPTH = 5  # how deep state dicts are looked for inside nested containers
_MAX_MODULE_NESTING = 256  # submodule levels read from a pickled nn.Module (real models: < 20)


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # never imported here: without torch nothing is a tensor
    return torch is not None and isinstance(value, torch.Tensor)


_SHOWN_DIGITS = 80
_LOG10_2 = math.log10(2)


def int_text(n: int) -> str:
    """An int as text; one of more than 80 digits shortened to its first and last digits and its
    length, computed without ``str(n)`` (which Python refuses beyond 4,300 digits, and which
    would take quadratic time on a hostile file's million-digit integer)."""
    if n.bit_length() <= 256:  # < 78 digits: str is exact and cheap
        return str(n)
    magnitude = -n if n < 0 else n
    digits = int(magnitude.bit_length() * _LOG10_2) + 1
    if magnitude < 10 ** (digits - 1):
        digits -= 1
    if digits <= _SHOWN_DIGITS:
        return str(n)
    lead = magnitude // 10 ** (digits - 8)
    tail = magnitude % 10 ** 6
    return f"{'-' if n < 0 else ''}{lead}…{tail:06d} (an int of {digits:,} digits)"


def value_text(value: Any) -> str:
    """``repr`` of a value read from a checkpoint, safe for any int (also inside a tuple key)."""
    if isinstance(value, bool) or not isinstance(value, (int, tuple)):
        try:
            return repr(value)
        except ValueError:  # an int subclass or a container holding a huge int
            return f"<{type(value).__name__} not shown>"
    if isinstance(value, int):
        return int_text(value)
    inner = ", ".join(value_text(v) for v in value[:8]) + (", …" if len(value) > 8 else "")
    return f"({inner},)" if len(value) == 1 else f"({inner})"


def _join(prefix: str, key: Any) -> str:
    text = key if isinstance(key, str) else value_text(key)
    return f"{prefix}.{text}" if prefix else text


def _is_optimizer_state(value: Any) -> bool:
    return isinstance(value, Mapping) and {"state", "param_groups"} <= set(value.keys())


def _placeholder_is_module(obj: OpaqueObject) -> bool:
    state = _placeholder_state(obj)
    return isinstance(state, Mapping) and "_parameters" in state and "_modules" in state


def _placeholder_state(obj: OpaqueObject) -> Any:
    state = obj.state
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], Mapping):
        state = state[0]  # (dict state, slot state)
    return state


def placeholder_module_state_dict(obj: OpaqueObject, prefix: str = "",
                                  _seen: set[int] | None = None) -> dict[str, Any]:
    """The state_dict a pickled nn.Module would return, read from its pickled ``__dict__``.

    Mirrors ``nn.Module.state_dict``: parameters, then persistent buffers, then children. A
    module reached twice (shared, or a hostile cycle) is read once.
    """
    seen = _seen if _seen is not None else set()
    state = _placeholder_state(obj)
    result: dict[str, Any] = {}
    if id(obj) in seen or not isinstance(state, Mapping) or prefix.count(".") > _MAX_MODULE_NESTING:
        return result
    seen.add(id(obj))
    for name, value in (state.get("_parameters") or {}).items():
        if value is not None and _is_tensor(value):
            result[prefix + name] = value
    non_persistent = set(state.get("_non_persistent_buffers_set") or ())
    for name, value in (state.get("_buffers") or {}).items():
        if value is not None and name not in non_persistent and _is_tensor(value):
            result[prefix + name] = value
    for name, child in (state.get("_modules") or {}).items():
        if isinstance(child, OpaqueObject) and _placeholder_is_module(child):
            result.update(placeholder_module_state_dict(child, f"{prefix}{name}.", seen))
    return result


def summarize(value: Any) -> str:
    """A short description of a non-tensor entry (epoch: 3, optimizer: SGD state …)."""
    if _is_optimizer_state(value):
        groups = value.get("param_groups") or []
        n_state = len(value.get("state") or {})
        hyper = ""
        if groups and isinstance(groups[0], Mapping):
            shown = {k: groups[0][k] for k in ("lr", "momentum", "betas", "weight_decay") if k in groups[0]}
            hyper = " " + ", ".join(f"{k}={value_text(v)}" for k, v in shown.items())
        return f"optimizer state: {len(groups)} param group(s), state for {n_state} parameter(s){hyper}"
    if isinstance(value, OpaqueObject):
        return f"{value.global_name} instance (class not loaded)"
    if _is_tensor(value):
        info = TensorInfo.of(value)
        return f"tensor {info.shape_text()} {info.dtype}"
    if isinstance(value, (int, float, bool, str)) or value is None:
        text = value_text(value[:81] if isinstance(value, str) else value)
        return text if len(text) <= 80 else text[:77] + "..."
    if isinstance(value, Mapping):
        return f"{type(value).__name__} with {len(value)} entries"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)} items"
    return type(value).__module__ + "." + type(value).__qualname__


class ContainerWalk:
    """The result of walking a loaded checkpoint object."""

    def __init__(self, limits: ReadLimits | None = None) -> None:
        self.state_dicts: list[StateDict] = []
        self.whole_model_at: list[str] = []
        self.other_entries: dict[str, str] = {}
        self.limits = limits or ReadLimits()
        self._seen: dict[int, str] = {}
        self._repeats: set[int] = set()
        self._more_repeats = 0
        self._nodes = 0
        self.truncated = False

    def walk(self, obj: Any) -> None:
        """Walk the root object; shared references are listed once each, then counted."""
        self._walk(obj, "", 0)
        if self._more_repeats:
            self.other_entries["(shared references)"] = (
                f"{self._more_repeats:,} further references to objects listed above (not repeated)")

    def _walk(self, obj: Any, where: str, depth: int) -> None:
        import torch

        self._nodes += 1
        if self._nodes > self.limits.max_nodes:
            if not self.truncated:
                self.truncated = True
                self.other_entries["(truncated)"] = (f"stopped after {self.limits.max_nodes:,} objects "
                                                     f"(NNDOCTOR_MAX_NODES): the rest is not shown")
            return
        if isinstance(obj, (Mapping, OpaqueObject, torch.nn.Module)) or (isinstance(obj, (list, tuple)) and obj):
            if id(obj) in self._seen:
                if id(obj) in self._repeats:
                    self._more_repeats += 1
                else:
                    self._repeats.add(id(obj))
                    self.other_entries[where or "(root)"] = f"same object as {self._seen[id(obj)]!r}"
                return
            self._seen[id(obj)] = where or "(root)"

        if isinstance(obj, torch.nn.Module):
            self.whole_model_at.append(where)
            self.state_dicts.append(StateDict(where, dict(obj.state_dict()), role="whole-model"))
            return
        if isinstance(obj, OpaqueObject):
            if _placeholder_is_module(obj):
                self.whole_model_at.append(where)
                self.state_dicts.append(
                    StateDict(where, placeholder_module_state_dict(obj), role="whole-model"))
            else:
                self.other_entries[where or "(root)"] = summarize(obj)
            return
        if _is_optimizer_state(obj):
            self.other_entries[where or "(root)"] = summarize(obj)
            return
        if isinstance(obj, Mapping):
            self._walk_mapping(obj, where, depth)
            return
        if isinstance(obj, (list, tuple)) and depth < _MAX_DEPTH and obj and any(
            isinstance(v, (Mapping, torch.nn.Module, OpaqueObject)) for v in obj
        ):
            for index, value in enumerate(obj):
                self._walk(value, _join(where, index), depth + 1)
            return
        self.other_entries[where or "(root)"] = summarize(obj)

    def _walk_mapping(self, obj: Mapping, where: str, depth: int) -> None:
        tensors = {k: v for k, v in obj.items() if isinstance(k, str) and _is_tensor(v)}
        # A state dict is a mapping whose values are (almost) all tensors.
        if tensors and len(tensors) >= max(1, len(obj) // 2):
            self.state_dicts.append(StateDict(where, tensors))
            for key, value in obj.items():
                if key not in tensors:
                    self.other_entries[_join(where, key)] = summarize(value)
            return
        if depth >= _MAX_DEPTH:
            self.other_entries[where or "(root)"] = summarize(obj)
            return
        for key, value in obj.items():
            self._walk(value, _join(where, key), depth + 1)
