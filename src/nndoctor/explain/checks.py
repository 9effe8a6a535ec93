"""The catalog's E codes: importing this module registers one explanation per code.

The registry imports ``nndoctor.explain.checks`` (``registry.CHECK_MODULES``); the
explanations live in small family modules, listed here.
"""

from __future__ import annotations

from nndoctor.explain import autograd, devices, distributed, environment, loading, shapes, state

FAMILIES = (devices, shapes, autograd, loading, state, environment, distributed)

__all__ = ["FAMILIES"]
