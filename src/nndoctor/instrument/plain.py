"""The installation of a run without PyTorch: only the feature installers that need no torch
(Keras, tf.data) are applied; everything is undone by ``uninstall()`` as with torch."""

from __future__ import annotations

from typing import Any

from nndoctor.instrument.patches import Patcher


class PlainInstallation:
    def __init__(self, session: Any) -> None:
        self.session = session
        self.patcher = Patcher()

    def install(self) -> PlainInstallation:
        self.session.active = True
        try:
            from nndoctor.instrument import extensions

            for installer in extensions.INSTALLERS:
                try:
                    installer(self)
                except ModuleNotFoundError as error:
                    # A PyTorch feature (it imports torch when installed): not this run's.
                    if (error.name or "").split(".")[0] not in extensions._FRAMEWORKS:
                        raise
        except BaseException:
            self.uninstall()
            raise
        return self

    def uninstall(self) -> None:
        self.session.active = False
        for error in self.patcher.undo_all():
            self.session.internal_error("uninstall", error)


def install(session: Any) -> PlainInstallation:
    return PlainInstallation(session).install()
