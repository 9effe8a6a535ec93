"""Who called a module: the frame past nndoctor's hooks and torch's module-call machinery.

Whether a frame is the user's code is answered by ``nndoctor.core.user_code`` (for every part of
nndoctor); this module adds what only the torch hook layer needs to know.
"""

from __future__ import annotations

import os
from types import FrameType

# checks/numerics.py (split on another branch) still imports user_location from here.
from nndoctor.core.user_code import (
    INTERNAL,
    code_rank,
    is_own_file,
    user_location,  # noqa: F401
)

_MODULE_CALL_FILE = os.path.join("torch", "nn", "modules", "module.py")
# ``OptimizedModule.__call__`` (torch.compile) sits between the user and the module call.
_COMPILED_CALL_FILE = os.path.join("torch", "_dynamo", "eval_frame.py")


def direct_caller(frame: FrameType | None) -> FrameType | None:
    """The frame that called a module (skipping nndoctor's hooks and torch's call machinery)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if is_own_file(filename) or filename.endswith((_MODULE_CALL_FILE, _COMPILED_CALL_FILE)):
            frame = frame.f_back
            continue
        return frame
    return None


def called_from_framework(frame: FrameType | None) -> bool:
    """True when the direct caller is torch itself (e.g. ``swa_utils.update_bn``)."""
    caller = direct_caller(frame)
    return caller is not None and code_rank(caller.f_code) == INTERNAL
