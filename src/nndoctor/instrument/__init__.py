"""Instrumentation: torch hooks and thin reversible patches that turn training activity into events.

This layer knows nothing of checks. ``install(session)`` returns an ``Installation`` whose
``uninstall()`` restores every patched attribute and removes every hook. Without PyTorch
(a TensorFlow-only environment) it is ``plain.PlainInstallation``: the feature patches that
need no torch (Keras, tf.data) only. Importing this package never imports torch, so its
helpers (``location``, ``patches``) serve the torch-free families too.
"""

from __future__ import annotations

import importlib.util
from typing import Any


def torch_available() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken install, or an import blocker
        return False


def install(session: Any) -> Any:
    if torch_available():
        from nndoctor.instrument.torch_hooks import install as install_torch

        return install_torch(session)
    from nndoctor.instrument.plain import install as install_plain

    return install_plain(session)


def __getattr__(name: str) -> Any:
    if name == "Installation":
        from nndoctor.instrument.torch_hooks import Installation

        return Installation
    raise AttributeError(name)


__all__ = ["Installation", "install"]
