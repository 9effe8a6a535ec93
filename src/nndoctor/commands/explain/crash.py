"""What one crash looks like to the explanations: the error, its frames, and (live) its context.

A ``Crash`` is built either from a live exception at the end of an ``nndoctor run`` (with the
engine's crash context and the traceback's frames, whose locals can be read on this path
only) or from traceback text pasted into ``nndoctor explain`` (message and frames only).
Checks read the same object either way and simply find less evidence in text.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from nndoctor.commands.explain.frames import Frame, worker_traceback_frames
from nndoctor.core.findings import Location
from nndoctor.core.user_code import display_path, is_user_code

if TYPE_CHECKING:
    from nndoctor.core.engine import Session


@dataclass
class Crash:
    """The error being explained. ``live`` fields are only set at runtime."""

    exc_type: str  # "RuntimeError", "torch.OutOfMemoryError" (module kept when not builtins)
    message: str  # str(exception), notes appended
    frames: list[Frame] = field(default_factory=list)  # outermost first
    # Frames of the original traceback inside a DataLoader worker's message, if any.
    worker_frames: list[Frame] = field(default_factory=list)
    # Text around the traceback in a log (kernel assertion lines, argparse usage ...).
    preamble: str = ""
    # -- live only ---------------------------------------------------------------------
    context: dict[str, Any] = field(default_factory=dict)  # the engine's crash context
    error: BaseException | None = None
    session: Session | None = None
    # Weak references to the innermost module that was running and to its root model.
    module_ref: Any = None
    root_ref: Any = None

    @property
    def short_type(self) -> str:
        return self.exc_type.rsplit(".", 1)[-1]

    @property
    def text(self) -> str:
        """Everything known in words: type, message and the log lines before it."""
        return f"{self.preamble}\n{self.exc_type}: {self.message}"

    @property
    def is_live(self) -> bool:
        return self.error is not None

    @property
    def location(self) -> Location | None:
        """The user's line: inside a worker's original traceback when there is one
        (the Dataset code that failed), else the innermost user frame of the traceback."""
        for frames in (self.worker_frames, self.frames):
            for frame in reversed(frames):
                if frame.is_user and frame.line is not None:
                    return Location(_display(frame.path), frame.line)
        return None

    @property
    def user_frame(self) -> Frame | None:
        for frame in reversed(self.frames):
            if frame.is_user:
                return frame
        return None

    def calls(self, function: str, path_part: str = "") -> bool:
        """Did the traceback pass through ``function`` (in a file whose path contains ``path_part``)?"""
        return any(f.function == function and path_part in f.path for f in self.frames + self.worker_frames)

    # -- live frames ---------------------------------------------------------------------
    def live_frames(self) -> list[FrameType]:
        """The traceback's frame objects, outermost first (empty for text)."""
        found: list[FrameType] = []
        tb: TracebackType | None = self.error.__traceback__ if self.error is not None else None
        while tb is not None:
            found.append(tb.tb_frame)
            tb = tb.tb_next
        return found

    def frame_locals(self, function: str, path_part: str = "") -> dict[str, Any] | None:
        """Locals of the innermost live frame running ``function`` (crash path only)."""
        for frame in reversed(self.live_frames()):
            code = frame.f_code
            if code.co_name == function and path_part in code.co_filename:
                return dict(frame.f_locals)
        return None


def _display(path: str) -> str:
    return display_path(path) if os.path.isabs(path) else path


def qualified_type(error: BaseException) -> str:
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def message_of(error: BaseException) -> str:
    """``str(error)`` plus its notes (where the crash instrumentation leaves batch indices)."""
    text = str(error)
    if isinstance(error, KeyError) and error.args:
        text = repr(error.args[0])
    notes = getattr(error, "__notes__", None) or []
    if notes:
        text = text + "\n" + "\n".join(str(n) for n in notes)
    return text


def from_exception(error: BaseException, *, context: dict[str, Any] | None = None, session: Session | None = None) -> Crash:
    """A live crash: the innermost exception of the chain is what the user sees last."""
    import traceback

    frames = []
    tb = error.__traceback__
    for entry in traceback.extract_tb(tb):
        code = tb.tb_frame.f_code if tb is not None else None
        user = is_user_code(code) if code is not None else None
        frames.append(Frame(entry.filename, entry.lineno, entry.name, (entry.line or "").strip(), user))
        tb = tb.tb_next if tb is not None else None
    message = message_of(error)
    # The exceptions this one was raised from (a worker's real death signal, a wrapped error)
    # are part of what happened: their messages are kept as the preamble.
    causes: list[str] = []
    cause = error.__cause__ or error.__context__
    while cause is not None and len(causes) < 3:
        causes.append(f"{qualified_type(cause)}: {message_of(cause)}")
        cause = cause.__cause__ or cause.__context__
    return Crash(
        exc_type=qualified_type(error),
        message=message,
        frames=frames,
        preamble="\n".join(reversed(causes)),
        worker_frames=worker_traceback_frames(message),
        context=dict(context or {}),
        error=error,
        session=session,
    )
