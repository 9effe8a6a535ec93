"""The installation of a run without PyTorch: only the feature installers that need no torch
(Keras, tf.data) are applied; everything is undone by ``uninstall()`` as with torch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nndoctor.instrument.patches import Patcher


class PlainInstallation:
    def __init__(self, session: Any, features: Sequence[Callable[[Any], None]]) -> None:
        self.session = session
        self.features = tuple(features)
        self.patcher = Patcher()

    def install(self) -> PlainInstallation:
        self.session.active = True
        try:
            for installer in self.features:
                installer(self)
        except BaseException:
            self.uninstall()
            raise
        return self

    def uninstall(self) -> None:
        self.session.active = False
        for error in self.patcher.undo_all():
            self.session.internal_error("uninstall", error)


def install(session: Any, features: Sequence[Callable[[Any], None]]) -> PlainInstallation:
    return PlainInstallation(session, features).install()
