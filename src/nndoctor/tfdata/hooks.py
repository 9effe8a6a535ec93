"""Run a function right after a package is imported (``import tensorflow`` in the user's script).

Importing TensorFlow costs seconds, so nndoctor never imports it: a ``sys.meta_path`` finder
lets the user's own import run with the package's loader and calls ``then(module)`` once it
is done. This is the one post-import hook of nndoctor: the Keras, tf.data, TensorBoard and
perf instrumentation all use it, so several may be stacked (one per package and feature),
and each steps aside while another one searches the meta path (``_searching``).
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from typing import Any


class AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name = name
        self.then = then
        self._loader: Any = None
        self._searching = False  # another stacked finder asks the meta path too: not us again

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self._searching:
            return None
        self._searching = True
        try:
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is None:
                    continue
                if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                    return None
                self._loader = spec.loader
                spec.loader = self
                return spec
        finally:
            self._searching = False
        return None

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        # A later ``importlib.reload`` uses the package's own loader, not a finished hook (with
        # hooks stacked on one package, each one's loader is the next hook: follow the chain).
        loader = self._loader
        while isinstance(loader, AfterImport):
            loader = loader._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and isinstance(spec.loader, AfterImport):
            spec.loader = loader
        if isinstance(getattr(module, "__loader__", None), AfterImport):
            module.__loader__ = loader
        self.remove()
        self.then(module)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def when_imported(name: str, then: Callable[[Any], None], patcher: Any) -> None:
    """``then(module)`` now if ``name`` is imported already, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return
    hook = AfterImport(name, then)
    sys.meta_path.insert(0, hook)
    patcher.on_undo(hook.remove)
