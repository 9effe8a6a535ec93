"""What a script may change in the interpreter during ``nndoctor run``, handled as python would.

- ``--max-steps`` reached in a training thread: StopRun ends that thread quietly (it is ours,
  not the script's error) and the run is reported as stopped.
- ``sys.excepthook`` set by the script is called for its uncaught exception (and Ctrl-C), with
  the traceback from the script's first frame, as python calls it.
- ``sys.stdout`` / ``sys.stderr`` replaced or set to None by the script are given back to
  nndoctor afterwards, with its ``sys.excepthook``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

from nndoctor.core.engine import StopRun
from nndoctor.core.tracebacks import user_frames_only


class ThreadStops:
    """``--max-steps`` reached in a training thread ends that thread quietly (StopRun is ours,
    not the script's error) and the run is reported as stopped."""

    def __init__(self) -> None:
        self.seen = False
        self._previous = threading.excepthook

    def __enter__(self) -> ThreadStops:
        self._previous = threading.excepthook
        threading.excepthook = self._hook
        return self

    def __exit__(self, *exc: object) -> None:
        if threading.excepthook == self._hook:
            threading.excepthook = self._previous

    def _hook(self, args: Any) -> None:
        if isinstance(args.exc_value, StopRun):
            self.seen = True
            return
        self._previous(args)


class ProcessState:
    """What the script may change in ``sys`` that nndoctor needs back afterwards, and the
    script's own ``sys.excepthook``, called for an uncaught exception as python would."""

    def __init__(self) -> None:
        self.stdout, self.stderr, self.excepthook = sys.stdout, sys.stderr, sys.excepthook
        self.uncaught: BaseException | None = None

    def call_users_excepthook(self) -> None:
        hook = sys.excepthook
        error = self.uncaught
        if error is None or hook is self.excepthook or hook is sys.__excepthook__:
            return
        try:
            hook(type(error), error, user_frames_only(error.__traceback__))
        except BaseException as failure:  # noqa: BLE001 - python reports it and goes on too
            from nndoctor.util.sanitize import printable

            with contextlib.suppress(Exception):
                line = f"nndoctor: the script's sys.excepthook raised {type(failure).__name__}: {failure}"
                print(printable(line, keep_newlines=False), file=self.stderr)

    def restore(self) -> None:
        sys.excepthook = self.excepthook
        for name in ("stdout", "stderr"):
            saved = getattr(self, name)
            if saved is not None and not getattr(saved, "closed", False):
                setattr(sys, name, saved)
