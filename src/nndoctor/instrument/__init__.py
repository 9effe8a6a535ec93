"""Instrumentation: torch hooks and thin reversible patches that turn training activity into events.

This layer knows nothing of checks. ``install(session)`` returns an ``Installation`` whose
``uninstall()`` restores every patched attribute and removes every hook.
"""

from nndoctor.instrument.torch_hooks import Installation, install

__all__ = ["Installation", "install"]
