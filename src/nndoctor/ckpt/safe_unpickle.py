"""Reading a pickle whose classes are not trusted, without calling any of them.

``torch.load(weights_only=True)`` refuses such files outright. To still show what is inside
(and to pull a state_dict out of a ``torch.save(model)`` file) this unpickler replaces every
global outside the allowlist with an inert placeholder class: calling or building it only
records its arguments. Nothing the file names is imported or executed.
"""

from __future__ import annotations

import pickle
from typing import Any

from nndoctor.ckpt.pickle_scan import python3_name

_FALLBACK_ALLOWLIST = {
    "collections.OrderedDict", "builtins.set", "builtins.frozenset", "builtins.slice",
    "builtins.complex", "builtins.bytearray", "_codecs.encode", "torch.Size", "torch.device",
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state", "torch.nn.parameter.Parameter",
}


def allowed_globals() -> dict[str, Any]:
    """The globals ``torch.load(weights_only=True)`` accepts: name -> object."""
    try:
        from torch import _weights_only_unpickler

        allowed = dict(_weights_only_unpickler._get_allowed_globals())
        allowed.update(_weights_only_unpickler._get_user_allowed_globals())
        return allowed
    except Exception:  # a torch without the private helper: fall back to a short, safe list
        import collections

        import torch

        resolved: dict[str, Any] = {}
        for name in _FALLBACK_ALLOWLIST:
            module, _, attr = name.rpartition(".")
            owner: Any = {"collections": collections, "torch": torch}.get(module)
            if owner is None:
                try:
                    owner = __import__(module, fromlist=[attr])
                except ImportError:
                    continue
            if hasattr(owner, attr):
                resolved[name] = getattr(owner, attr)
        return resolved


def is_allowed(global_name: str, allowed: dict[str, Any]) -> bool:
    module, _, name = global_name.rpartition(".")
    # torch names storages by class (torch.FloatStorage); its loader maps all of them itself.
    return global_name in allowed or (module == "torch" and name.endswith("Storage"))


class OpaqueObject:
    """Stands in for an instance of a class the file names but nobody trusts."""

    _nnd_global = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> OpaqueObject:
        self = object.__new__(cls)
        self.__dict__["_nnd_args"] = args
        self.__dict__["_nnd_state"] = None
        self.__dict__["_nnd_items"] = []
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args and not self._nnd_args:
            self.__dict__["_nnd_args"] = args

    def __setstate__(self, state: Any) -> None:
        self.__dict__["_nnd_state"] = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self._nnd_items.append((key, value))

    def append(self, value: Any) -> None:
        self._nnd_items.append((None, value))

    def extend(self, values: Any) -> None:
        for value in values:
            self.append(value)

    def __repr__(self) -> str:
        return f"<{self._nnd_global} (not loaded)>"

    @property
    def global_name(self) -> str:
        return self._nnd_global

    @property
    def state(self) -> Any:
        return self._nnd_state


_placeholders: dict[str, type[OpaqueObject]] = {}


def placeholder_for(global_name: str) -> type[OpaqueObject]:
    cls = _placeholders.get(global_name)
    if cls is None:
        cls = type(global_name.rpartition(".")[2] or "Opaque", (OpaqueObject,),
                   {"_nnd_global": global_name})
        _placeholders[global_name] = cls
    return cls


class PlaceholderUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only allowlisted globals; the rest become placeholders."""

    _allowed: dict[str, Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        full = python3_name(module, name)
        if full in self._allowed:
            return self._allowed[full]
        # Storage names (torch.FloatStorage) never get here: torch's loader maps them first.
        return placeholder_for(full)


class PlaceholderPickleModule:
    """A ``pickle_module`` for ``torch.load`` that never calls untrusted globals."""

    Unpickler = PlaceholderUnpickler
    UnpicklingError = pickle.UnpicklingError
    __name__ = "nndoctor_placeholder_pickle"

    def __init__(self) -> None:
        PlaceholderUnpickler._allowed = allowed_globals()

    @staticmethod
    def load(file: Any, **kwargs: Any) -> Any:
        return PlaceholderUnpickler(file, **kwargs).load()


def load_with_placeholders(path: str) -> Any:
    """``torch.load`` where untrusted classes become OpaqueObject placeholders."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=False,
                      pickle_module=PlaceholderPickleModule())
