"""nndoctor: finds the bugs that silently ruin deep-learning training.

The public API is small: ``watch()`` to observe training in your own code or a notebook,
and the ``Report``/``Finding`` types it returns. Importing nndoctor does not import torch.
"""

from __future__ import annotations

# isort: off
# First, before any other import: `python -m nndoctor` must not import the user's files.
from nndoctor.run import _startup  # noqa: F401
# isort: on

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from nndoctor.core._version import __version__
from nndoctor.core.findings import Finding, Location, Report, Severity

if TYPE_CHECKING:
    from nndoctor.integrations.api import watch

__all__ = ["Finding", "Location", "Report", "Severity", "__version__", "watch"]


def __getattr__(name: str) -> Any:
    if name == "watch":
        from nndoctor.integrations.api import watch

        return watch
    raise AttributeError(f"module 'nndoctor' has no attribute {name!r}")


# Old public import paths (issue 34): modules that moved into nndoctor.integrations stay
# importable under the names users and older installs know (`from nndoctor.lightning import
# DoctorCallback`, the pytest11 entry point `nndoctor.pytest_plugin`). The finder imports the new
# module only when an old name is imported; `import nndoctor` imports none of them.
_PUBLIC_ALIASES = {
    "nndoctor.lightning": "nndoctor.integrations.lightning",
    "nndoctor.transformers": "nndoctor.integrations.transformers",
    "nndoctor.pytest_plugin": "nndoctor.integrations.pytest_plugin",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # The module itself, not a copy: both names share its objects (isinstance, monkeypatch).
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its own name


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _PUBLIC_ALIASES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(_PUBLIC_ALIASES[fullname]))


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.append(_AliasFinder())
