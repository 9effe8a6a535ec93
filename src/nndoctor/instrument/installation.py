"""What every feature installer is given: the run's installation.

Two classes provide it: ``instrument/torch_hooks.py``'s ``Installation`` (PyTorch's hooks and
patches) and ``instrument/plain.py``'s ``PlainInstallation`` (no PyTorch: Keras and tf.data
only). An installer patches through ``patcher`` (undone by ``uninstall()``) and emits events
through ``session``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from nndoctor.core.engine import Session
    from nndoctor.instrument.features import Feature
    from nndoctor.instrument.patches import Patcher


class InstallationProtocol(Protocol):
    session: Session
    # The features of this run, in install order (a spawned child installs the same ones).
    features: tuple[Feature, ...]
    patcher: Patcher
    probes: list[str]  # names of the features installed

    def uninstall(self) -> None: ...
