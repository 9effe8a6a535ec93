"""Warnings that torch raises through our wrappers, shown at the line that called the wrapper.

torch warns with ``stacklevel=2`` — "at the caller of ``scheduler.step()``" or "of
``F.mse_loss``". With nndoctor's wrapper in between, that caller is the wrapper, so the user
would read ``nndoctor/instrument/torch_hooks.py:585: UserWarning: Detected call of
`lr_scheduler.step()` before `optimizer.step()`` and blame nndoctor. While a session is
installed, a warning whose location is inside nndoctor is shown at the first frame outside
nndoctor above the wrapper, exactly where the warning would have pointed without it.

Only the displayed location changes. Filters and ``-W error`` work as before (they run
before the warning is shown) and no filter is touched (touching ``warnings.filters`` makes
every module forget which warnings it already showed). One difference remains, as before
this module: the "once per location" registry still sees the wrapper's line, so under the
default filter an identical warning from a second user line that calls the same wrapper is
not shown again.
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Any

from nndoctor.core.user_code import is_own_file

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol

# ``warnings`` with its private ``_showwarnmsg`` hook (not in the stubs), read and replaced here.
_warnings_module: Any = warnings


def caller_past_wrappers(filename: str, lineno: int, frame: Any) -> tuple[str, int] | None:
    """Where a warning located at our ``filename:lineno`` would point without our frames.

    Walks out from ``frame`` to the wrapper frame at that line, then past every nndoctor
    frame; None when the warning is not ours or the frame is not on the stack.
    """
    if not is_own_file(filename):
        return None
    while frame is not None and not (frame.f_code.co_filename == filename and frame.f_lineno == lineno):
        frame = frame.f_back
    while frame is not None and is_own_file(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno


# torch.compile warns on every ``OptimizedModule`` call while any global module hook exists.
# The hooks are ours, and they step aside while dynamo traces: the warning describes
# nndoctor, not the user's program, so it is not shown during a session.
_OWN_HOOK_WARNING = "Using `torch.compile(module)` when there are global hooks on modules"


def is_about_our_hooks(msg: Any) -> bool:
    return str(getattr(msg, "message", "")).startswith(_OWN_HOOK_WARNING)


def install(installation: InstallationProtocol) -> None:
    # ``warnings._showwarnmsg`` is the one function both the C and the Python implementation
    # of ``warn`` call with the whole WarningMessage (3.6+): relaying there keeps ``source``
    # (the tracemalloc traceback of a ResourceWarning) and leaves ``warnings.showwarning``,
    # which users and libraries replace, alone.
    previous = getattr(warnings, "_showwarnmsg", None)
    if previous is None:  # pragma: no cover - another Python implementation
        return

    def _showwarnmsg(msg):
        if is_about_our_hooks(msg):
            return None
        try:
            moved = caller_past_wrappers(msg.filename, msg.lineno, sys._getframe(1))
        except Exception:  # noqa: BLE001 - observer rule: show the warning as it was
            moved = None
        if moved is not None:
            msg.filename, msg.lineno = moved
            msg.line = None  # read from the new location
        return previous(msg)

    _warnings_module._showwarnmsg = _showwarnmsg

    def restore() -> None:
        if _warnings_module._showwarnmsg is _showwarnmsg:  # not if someone replaced it since
            _warnings_module._showwarnmsg = previous

    installation.patcher.on_undo(restore)
