"""Reversible attribute patches: every patch is recorded and undone in reverse order.

An installer reads the original, defines the wrapper that calls it, then patches::

    original = torch.nn.Module.train

    @functools.wraps(original)
    def train(module, mode=True): ...

    installation.patcher.patch(torch.nn.Module, "train", train)

(never ``torch.nn.Module.train = train``: that is not undone at uninstall, and mypy rejects
an assignment to a method).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MISSING = object()


class Patcher:
    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []
        self._removers: list[Callable[[], None]] = []

    def patch(self, owner: Any, name: str, replacement: Any) -> Any:
        """Replace ``owner.name`` and return the original (looked up in ``owner.__dict__``
        first so a patch on a subclass never captures the base class's attribute)."""
        original = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
        current = getattr(owner, name)
        self._undo.append((owner, name, original))
        setattr(owner, name, replacement)
        return current

    def on_undo(self, remover: Callable[[], None]) -> None:
        """Run ``remover`` at uninstall (for hook handles)."""
        self._removers.append(remover)

    def undo_all(self) -> list[BaseException]:
        errors: list[BaseException] = []
        for remover in reversed(self._removers):
            try:
                remover()
            except BaseException as error:  # noqa: BLE001 - restore everything we can
                errors.append(error)
        self._removers.clear()
        for owner, name, original in reversed(self._undo):
            try:
                if original is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, original)
            except BaseException as error:  # noqa: BLE001
                errors.append(error)
        self._undo.clear()
        return errors
