"""The module that was running when the user's code raised: recorded by the module-call wrapper on the
exception path, read by the crash explanation and the ``crash`` event.

Kept in the session's stash (``CRASH_CONTEXT``), so a nested session's crash never describes
the outer run's module. Importing this module imports no framework.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from nndoctor.core.stash import StashKey


@dataclass
class CrashContext:
    """The last exception seen unwinding through a module, and that module (crash path only)."""

    # module_path, module_qualname, module_type, inputs, parameters, training, step …
    context: dict[str, Any] = field(default_factory=dict)
    # Exceptions cannot be weakly referenced, and a strong reference would keep the
    # traceback's frames (and the user's tensors) alive: the id only.
    exception_id: int | None = None
    module: weakref.ref | None = None

    def for_exception(self, error: BaseException) -> dict[str, Any]:
        """A copy of the context if it was recorded for this very exception, else ``{}`` (a
        context left by an exception the user caught earlier would describe the wrong module)."""
        return dict(self.context) if self.exception_id == id(error) else {}


CRASH_CONTEXT = StashKey[CrashContext]("crash context")


def crash_context(session: Any) -> CrashContext | None:
    """The session's crash context (None for an object that is not a run's session)."""
    stash = getattr(session, "stash", None)
    if stash is None:
        return None
    return stash.get_or_create(CRASH_CONTEXT, CrashContext)
