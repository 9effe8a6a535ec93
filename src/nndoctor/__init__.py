"""nndoctor: finds the bugs that silently ruin deep-learning training.

The public API is small: ``watch()`` to observe training in your own code or a notebook,
and the ``Report``/``Finding`` types it returns. Importing nndoctor does not import torch.
"""

from __future__ import annotations

# isort: off
# First, before any other import: `python -m nndoctor` must not import the user's files.
from nndoctor import _startup  # noqa: F401
# isort: on

from typing import TYPE_CHECKING, Any

from nndoctor._version import __version__
from nndoctor.findings import Finding, Location, Report, Severity

if TYPE_CHECKING:
    from nndoctor.api import watch

__all__ = ["Finding", "Location", "Report", "Severity", "__version__", "watch"]


def __getattr__(name: str) -> Any:
    if name == "watch":
        from nndoctor.api import watch

        return watch
    raise AttributeError(f"module 'nndoctor' has no attribute {name!r}")
