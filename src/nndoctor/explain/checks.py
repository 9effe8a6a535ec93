"""The catalog's E codes: importing this module registers one explanation per code.

The registry imports ``nndoctor.explain.checks`` (``registry.CHECK_MODULES``); the
explanations live in small family modules, listed here.
"""

from __future__ import annotations

from nndoctor.explain import (
    autograd,
    devices,
    distributed,
    dtypes,
    environment,
    loading,
    memory,
    shapes,
    state,
)

FAMILIES = (devices, dtypes, memory, shapes, autograd, loading, state, environment, distributed)

__all__ = ["FAMILIES"]
