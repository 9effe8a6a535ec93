"""The globals a checkpoint pickle may name and still be read: tensor and container rebuilders only.

An allowlist decides, not a list of known-bad modules: anything a pickle names that is not listed
here can run code when loaded (``os.system``, ``timeit.timeit``, ``pdb.run``,
``builtins.getattr``, ``operator.methodcaller``, any class whose module has import side effects…),
so it is reported (C104, error) and replaced by an inert placeholder while reading.

Two kinds of entries:

- *callables*: what a pickle may call (REDUCE/NEWOBJ) — tensor rebuild functions, ``OrderedDict``,
  ``set``. Those that could allocate without bound are wrapped by safe_unpickle with a size check.
- *values*: names a pickle may only mention (``torch.Tensor`` as a type argument, dtypes, storage
  classes, ``numpy.ndarray``); calling them is refused, because ``torch.FloatTensor(10**10)`` is an
  allocation bomb built entirely from "safe" names.

The list follows what ``torch.save`` and ``numpy.save`` emit for dense tensors, parameters, dtypes
and plain containers. Sparse, meta, quantized and nested tensors are left out on purpose: torch
builds sparse tensors without checking their invariants ("memory errors (e.g. SEGFAULT) will
occur"), and meta tensors can declare any size (PyTorch docs, "weights_only": https://pytorch.org/docs/stable/notes/serialization.html#weights-only).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

CALLABLE_NAMES = frozenset({
    "builtins.set", "builtins.frozenset", "builtins.complex", "builtins.slice", "builtins.bytearray",
    "collections.OrderedDict", "collections.Counter", "_codecs.encode",
    "torch.Size", "torch.device", "torch.nn.parameter.Parameter", "torch.serialization._get_layout",
    "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
    "torch._tensor._rebuild_from_type_v2",
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar", "numpy.dtype",
    "numpy.core.numeric._frombuffer", "numpy._core.numeric._frombuffer",
})
VALUE_NAMES = frozenset({"torch.Tensor", "numpy.ndarray"})

# Only these modules are ever looked into, and only by exact attribute name.
_ROOTS = ("builtins", "collections", "_codecs", "torch", "numpy")


def _resolve(name: str) -> Any:
    import importlib
    import warnings

    parts = name.split(".")
    if parts[0] not in _ROOTS:
        raise KeyError(name)
    for split in range(len(parts) - 1, 0, -1):
        with warnings.catch_warnings():  # numpy 2 warns on numpy.core, which old pickles name
            warnings.simplefilter("ignore")
            try:
                owner: Any = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            for attr in parts[split:]:
                owner = getattr(owner, attr)
        return owner
    raise KeyError(name)


@lru_cache(maxsize=1)
def _tables() -> tuple[dict[str, Any], dict[str, Any]]:
    callables: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for table, names in ((callables, CALLABLE_NAMES), (values, VALUE_NAMES)):
        for name in names:
            try:
                table[name] = _resolve(name)
            except (KeyError, AttributeError, ImportError):
                pass  # an older torch or numpy without this rebuild function
    return callables, values


def _torch_constant(name: str) -> Any:
    """``torch.float32``, ``torch.strided``, ``torch.per_tensor_affine``: plain constants, never callables."""
    import torch

    module, _, attr = name.rpartition(".")
    if module != "torch" or not attr.isidentifier():
        return None
    value = getattr(torch, attr, None)
    constant_types = (torch.dtype, torch.layout, torch.memory_format, torch.qscheme)
    return value if isinstance(value, constant_types) else None


def is_storage_name(name: str) -> bool:
    """``torch.FloatStorage``, ``torch.cuda.HalfStorage``: torch's loader maps these itself."""
    module, _, attr = name.rpartition(".")
    return module in ("torch", "torch.cuda") and attr.endswith("Storage") and attr.isidentifier()


def is_allowed(name: str) -> bool:
    """True when a pickle may name ``name`` (a ``module.qualname`` string) and still be read."""
    callables, values = _tables()
    return (name in callables or name in values or is_storage_name(name)
            or _torch_constant(name) is not None)


def allowed_callable(name: str) -> Any:
    """The object for an allowlisted callable name, else None."""
    return _tables()[0].get(name)


def allowed_value(name: str) -> Any:
    """The object for an allowlisted value-only name (type, dtype, constant), else None."""
    value = _tables()[1].get(name)
    return value if value is not None else _torch_constant(name)


def callable_objects() -> list[Any]:
    return list(_tables()[0].values())
