"""A typed store for per-run state: each feature keeps its records on the Session under its own key.

The idea is pytest's ``Stash``: a module that needs per-run state declares a key at import
time, ``TARGET_RANGES = StashKey[TargetProbe]()``, and reads and writes
``session.stash[TARGET_RANGES]``. The state then lives and dies with its session — two
sessions in one process (nested ``watch()`` blocks, a test inside a run) never see each
other's records — and no module keeps a global table keyed by sessions. Keys are compared
by identity, so two modules can never collide on a name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")
D = TypeVar("D")


class StashKey(Generic[T]):
    """A key into a ``Stash``; the type parameter is the type of the value stored under it."""

    __slots__ = ("description",)

    def __init__(self, description: str = "") -> None:
        self.description = description

    def __repr__(self) -> str:
        return f"StashKey({self.description!r})"


class Stash:
    """Values of any type, each under its typed key (``stash[key]`` is typed as ``T``)."""

    __slots__ = ("_storage",)

    def __init__(self) -> None:
        self._storage: dict[StashKey[Any], object] = {}

    def __setitem__(self, key: StashKey[T], value: T) -> None:
        self._storage[key] = value

    def __getitem__(self, key: StashKey[T]) -> T:
        return cast(T, self._storage[key])

    def get(self, key: StashKey[T], default: D) -> T | D:
        try:
            return self[key]
        except KeyError:
            return default

    def setdefault(self, key: StashKey[T], default: T) -> T:
        """The value under ``key``, storing ``default`` first when there is none."""
        try:
            return self[key]
        except KeyError:
            self[key] = default
            return default

    def get_or_create(self, key: StashKey[T], factory: Callable[[], T]) -> T:
        """Like ``setdefault``, but builds the default only when the key is missing."""
        try:
            return self[key]
        except KeyError:
            value = self[key] = factory()
            return value

    def __delitem__(self, key: StashKey[T]) -> None:
        del self._storage[key]

    def __contains__(self, key: StashKey[T]) -> bool:
        return key in self._storage

    def __len__(self) -> int:
        return len(self._storage)
