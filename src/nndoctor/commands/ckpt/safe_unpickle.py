"""Reading a pickle whose contents are not trusted, without calling anything the file chooses.

``torch.load(weights_only=True)`` refuses files that name classes outside its list, and its list
still lets a pickle call ``bytearray(1_500_000_000)`` or ``torch.FloatTensor(10**10)``. This
unpickler (pure Python, so every opcode goes through code we control):

- resolves only allowlisted names (allowlist.py), by exact lookup, never by import or getattr;
  every other global becomes an inert placeholder class that just records its arguments;
- calls (REDUCE/NEWOBJ/INST/OBJ) only allowlisted callables and placeholders, with size checks
  on those that allocate;
- sets state (BUILD) only on placeholders, tensors and numpy arrays, never on a class;
- bounds the storages torch allocates for the tensors the pickle declares by the file's size.

Nothing the file names is imported or executed.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable
from typing import Any, ClassVar

from nndoctor.commands.ckpt import allowlist
from nndoctor.commands.ckpt.pickle_scan import python3_name
from nndoctor.util.limits import ReadLimits, megabytes


class RefusedPickle(pickle.UnpicklingError):
    """The pickle asked for something the inert reader will not do (a call, a huge allocation)."""


class OpaqueObject:
    """Stands in for an instance of a class the file names but nobody trusts."""

    _nnd_global = "?"
    # Set in __new__, in the instance's __dict__.
    _nnd_args: tuple[Any, ...]
    _nnd_state: Any
    _nnd_items: list[tuple[Any, Any]]

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

    def add(self, value: Any) -> None:
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
# Distinct placeholder classes kept for reuse; beyond this, new ones are not cached (a class
# costs ~1 KB, and a hostile pickle can name a million globals in a few MB).
_PLACEHOLDERS_CACHED = 4096
# Different untrusted names one pickle may use: a whole-model pickle of a large network names
# a few dozen classes.
MAX_PLACEHOLDER_NAMES = 10_000


def placeholder_for(global_name: str) -> type[OpaqueObject]:
    cls = _placeholders.get(global_name)
    if cls is None:
        short = global_name.rpartition(".")[2]
        cls = type(short if short.isidentifier() else "Opaque", (OpaqueObject,), {"_nnd_global": global_name})
        if len(_placeholders) < _PLACEHOLDERS_CACHED:
            _placeholders[global_name] = cls
    return cls


def _is_placeholder_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, OpaqueObject)


def _element_count(shape: Any) -> int:
    if isinstance(shape, int):
        return shape
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) for d in shape):
        raise RefusedPickle(f"refusing an array shape that is not a tuple of integers: {type(shape).__name__}")
    return math.prod(shape)


_PLAIN_CODECS = frozenset({"latin1", "latin-1", "iso-8859-1", "iso8859-1", "ascii", "utf-8", "utf8"})


def _itemsize(dtype: Any) -> int:
    """Bytes per element of a numpy dtype given as a dtype or its code (b"b", "<f8")."""
    import numpy as np

    if isinstance(dtype, bytes):
        dtype = dtype.decode("latin1")
    if not isinstance(dtype, (np.dtype, str)):
        raise RefusedPickle(f"refusing a numpy dtype given as {type(dtype).__name__}")
    try:
        return max(1, np.dtype(dtype).itemsize)
    except (TypeError, ValueError) as error:
        raise RefusedPickle(f"refusing the numpy dtype {dtype!r}: {error}") from None


def check_attribute_state(state: Any) -> None:
    """torch sets these as attributes on the rebuilt tensor: plain names only, no dunders.

    An instance attribute named ``__reduce_ex__`` would be called by the next pickle.dump.
    """
    parts = state if isinstance(state, tuple) else (state,)
    for part in parts:
        if part is None:
            continue
        if not isinstance(part, dict) or not all(
                isinstance(k, str) and k.isidentifier() and not k.startswith("__") for k in part):
            raise RefusedPickle("refusing tensor state that is not plain attribute names")


class _Guards:
    """Size-checked versions of the allowlisted callables that can allocate."""

    def __init__(self, limits: ReadLimits) -> None:
        self.limit = limits.max_alloc_bytes
        callables = allowlist.callable_objects()
        self.wrapped: dict[int, Any] = {}
        bytearray_ = allowlist.allowed_callable("builtins.bytearray")
        if bytearray_ is not None:
            self.wrapped[id(bytearray_)] = self.bytearray
        for name in ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct"):
            func = allowlist.allowed_callable(name)
            if func is not None:
                self.wrapped[id(func)] = self._reconstruct_with(func)
        for name in ("numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar"):
            func = allowlist.allowed_callable(name)
            if func is not None:
                self.wrapped[id(func)] = self._scalar_with(func)
        encode = allowlist.allowed_callable("_codecs.encode")
        if encode is not None:
            self.wrapped[id(encode)] = self._encode_with(encode)
        rebuild = allowlist.allowed_callable("torch._tensor._rebuild_from_type_v2")
        if rebuild is not None:
            self.wrapped[id(rebuild)] = self._rebuild_from_type_with(rebuild)
        with_state = allowlist.allowed_callable("torch._utils._rebuild_parameter_with_state")
        if with_state is not None:
            self.wrapped[id(with_state)] = self._parameter_with_state(with_state)
        self.callable_ids = {id(obj) for obj in callables}
        import collections

        import torch

        self.tensor_types = (torch.Tensor,)
        self.plain_dicts = (collections.OrderedDict, collections.Counter)

    def check_bytes(self, nbytes: int, what: str) -> None:
        if nbytes < 0 or nbytes > self.limit:
            raise RefusedPickle(f"refusing to allocate {megabytes(nbytes)} for {what} (limit "
                                f"{megabytes(self.limit)}, NNDOCTOR_MAX_ALLOC_MB)")

    def bytearray(self, *args: Any) -> bytearray:
        if args and isinstance(args[0], int):
            self.check_bytes(args[0], "bytearray(n)")
        return bytearray(*args)

    def _reconstruct_with(self, func: Any) -> Any:
        def reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
            self.check_bytes(_element_count(shape) * _itemsize(dtype), "a numpy array")
            return func(subtype, shape, dtype)

        return reconstruct

    def _scalar_with(self, func: Any) -> Any:
        def scalar(dtype: Any, *args: Any) -> Any:
            self.check_bytes(_itemsize(dtype), "a numpy scalar")
            return func(dtype, *args)

        return scalar

    @staticmethod
    def _encode_with(func: Any) -> Any:
        # torch and numpy pickle bytes as _codecs.encode(text, "latin1"); other codec names
        # would look up codecs by a name the file chooses.
        def encode(text: Any, encoding: str = "utf-8", errors: str = "strict") -> Any:
            if str(encoding).lower().replace("_", "-") not in _PLAIN_CODECS:
                raise RefusedPickle(f"refusing the codec {encoding!r}")
            return func(text, encoding, errors)

        return encode

    def _rebuild_from_type_with(self, func: Any) -> Any:
        # _rebuild_from_type_v2(func, new_type, args, state) calls func(*args): func must be allowed too.
        def rebuild_from_type(inner: Any, new_type: Any, args: Any, state: Any) -> Any:
            inner = self.callable_for(inner)
            if not (isinstance(new_type, type) and issubclass(new_type, self.tensor_types)):
                raise RefusedPickle(f"refusing to rebuild a tensor as {new_type!r}")
            check_attribute_state(state)
            return func(inner, new_type, args, state)

        return rebuild_from_type

    def _parameter_with_state(self, func: Any) -> Any:
        def rebuild(data: Any, requires_grad: Any, backward_hooks: Any, state: Any) -> Any:
            check_attribute_state(state)
            return func(data, requires_grad, backward_hooks, state)

        return rebuild

    def callable_for(self, func: Any) -> Any:
        """``func`` itself (or its size-checked version) if a pickle may call it; else refuse."""
        if _is_placeholder_class(func):
            return func
        if id(func) in self.callable_ids:
            return self.wrapped.get(id(func), func)
        raise RefusedPickle(f"refusing to call {getattr(func, '__qualname__', type(func).__name__)}: "
                            f"not a tensor or container rebuild function")

    def check_build(self, inst: Any, state: Any) -> None:
        import numpy as np

        if isinstance(inst, OpaqueObject) or isinstance(inst, self.tensor_types) or isinstance(inst, np.dtype):
            return
        if isinstance(inst, np.ndarray) and not isinstance(inst, type):
            # ndarray.__setstate__((version,) shape, dtype, is_fortran, data)
            if not isinstance(state, tuple) or len(state) not in (4, 5):
                raise RefusedPickle("refusing a numpy array state of an unknown form")
            shape, dtype = state[-4], state[-3]
            self.check_bytes(_element_count(shape) * _itemsize(dtype), "a numpy array")
            return
        raise RefusedPickle(f"refusing to set the state of {type(inst).__name__} objects")


class InertUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
    """Unpickler that resolves only allowlisted globals; the rest become placeholders.

    ``limits`` bounds allocations; ``storage_budget`` (bytes) bounds the tensor storages torch
    allocates from persistent ids, which in a genuine file never exceed the file's size.
    """

    limits: ReadLimits = ReadLimits()
    storage_budget: int | None = None
    # The pure-Python unpickler's working state, set by its load() (private, not in the stubs).
    stack: list[Any]
    append: Callable[[Any], None]

    def __init__(self, file: Any, **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self._guards = _Guards(self.limits)
        self._torch_persistent_load: Any = None
        self._storage_keys: set[Any] = set()
        self._placeholder_names: set[str] = set()
        self._storage_bytes = 0

    def find_class(self, module: str, name: str) -> Any:
        full = python3_name(module, name)
        found = allowlist.allowed_callable(full)
        if found is None:
            found = allowlist.allowed_value(full)
        if found is not None:
            return found
        self._placeholder_names.add(full)
        if len(self._placeholder_names) > MAX_PLACEHOLDER_NAMES:
            raise RefusedPickle(f"the pickle names more than {MAX_PLACEHOLDER_NAMES:,} different classes "
                                f"or functions: not read further")
        return placeholder_for(full)

    # -- persistent ids: torch assigns its own loader; every storage it builds is size-checked first
    @property  # type: ignore[override]
    def persistent_load(self) -> Any:
        return self._bounded_persistent_load

    @persistent_load.setter
    def persistent_load(self, func: Any) -> None:
        self._torch_persistent_load = func

    def _bounded_persistent_load(self, pid: Any) -> Any:
        if self._torch_persistent_load is None:
            raise pickle.UnpicklingError("persistent id in a plain pickle")
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] in ("storage", b"storage"):
            self._check_storage(pid[1], pid[2], pid[4])
        return self._torch_persistent_load(pid)

    def _check_storage(self, storage_type: Any, key: Any, numel: Any) -> None:
        import torch

        if not isinstance(numel, int) or numel < 0:
            raise RefusedPickle(f"storage {key!r} declares a size that is not a count: {numel!r}")
        dtype = getattr(storage_type, "dtype", None) if storage_type is not torch.UntypedStorage else None
        itemsize = dtype.itemsize if isinstance(dtype, torch.dtype) else 1
        if key in self._storage_keys:
            return
        self._storage_keys.add(key)
        self._storage_bytes += numel * itemsize
        if self.storage_budget is not None and self._storage_bytes > self.storage_budget:
            raise RefusedPickle(f"the pickle declares {megabytes(self._storage_bytes)} of tensor storage "
                                f"but the file holds only {megabytes(self.storage_budget)}")

    # -- the opcodes that call or mutate objects
    def _load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        func = self._guards.callable_for(stack[-1])
        stack[-1] = func(*args)

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self._guards.callable_for(self.stack.pop())
        self.append(cls.__new__(cls, *args))

    def _load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self._guards.callable_for(self.stack.pop())
        self.append(cls.__new__(cls, *args, **kwargs))

    def _instantiate(self, klass: Any, args: Any) -> None:
        self.append(self._guards.callable_for(klass)(*args))

    def _load_build(self) -> None:
        stack = self.stack
        state = stack.pop()
        inst = stack[-1]
        if isinstance(inst, type):
            raise RefusedPickle(f"refusing to set attributes on the class {inst.__name__}")
        if type(inst) in self._guards.plain_dicts:
            # state_dict()'s OrderedDict carries its _metadata (module versions) as attributes.
            if isinstance(state, tuple) and len(state) == 2 and state[1] is None:
                state = state[0]
            if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
                raise RefusedPickle("refusing non-attribute state on a dictionary")
            inst.__dict__.update(state)
            return
        self._guards.check_build(inst, state)
        setstate = getattr(inst, "__setstate__", None)
        if setstate is None:
            raise RefusedPickle(f"refusing to set the state of {type(inst).__name__} objects")
        setstate(state)

    dispatch: ClassVar[dict[int, Callable[..., None]]] = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]
    dispatch[pickle.REDUCE[0]] = _load_reduce
    dispatch[pickle.NEWOBJ[0]] = _load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = _load_newobj_ex
    dispatch[pickle.BUILD[0]] = _load_build


def inert_unpickler_class(limits: ReadLimits, storage_budget: int | None) -> type[InertUnpickler]:
    """An InertUnpickler subclass bound to these limits (torch instantiates the class itself)."""
    return type("BoundInertUnpickler", (InertUnpickler,), {"limits": limits, "storage_budget": storage_budget})


class InertPickleModule:
    """A ``pickle_module`` for ``torch.load`` that never calls untrusted globals."""

    UnpicklingError = pickle.UnpicklingError
    __name__ = "nndoctor_inert_pickle"

    def __init__(self, limits: ReadLimits, storage_budget: int | None) -> None:
        self.Unpickler = inert_unpickler_class(limits, storage_budget)

    def load(self, file: Any, **kwargs: Any) -> Any:
        return self.Unpickler(file, **kwargs).load()


def inert_load_pickle(file: Any, limits: ReadLimits) -> Any:
    """One plain pickle from ``file``, read inertly."""
    return inert_unpickler_class(limits, None)(file).load()


def inert_torch_load(source: Any, limits: ReadLimits, *, size: int, mmap: bool = False) -> Any:
    """``torch.load`` (of a path, or of bytes in memory) through the inert unpickler; tensor
    storages bounded by ``size``, the file's size."""
    import torch

    module = InertPickleModule(limits, size)
    return torch.load(source, map_location="cpu", weights_only=False, pickle_module=module, mmap=mmap)
