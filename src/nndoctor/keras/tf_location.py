"""The user's line inside ``tf.function`` code.

AutoGraph traces a converted copy of the user's function, loaded from a temporary
``__autograph_generated_file…``; its line numbers are not the user's. TensorFlow keeps a
source map for that copy and applies it in ``tf_stack.extract_stack()``, so when such a
frame is on the stack the location is read from TensorFlow's mapped stack instead.
"""

from __future__ import annotations

import sys
from types import FrameType

from nndoctor.core.findings import Location
from nndoctor.core.user_code import display_path, rank_filename, user_location

_AUTOGRAPH_FILE = "__autograph_generated_file"


def _traced_by_autograph(frame: FrameType | None) -> bool:
    while frame is not None:
        if _AUTOGRAPH_FILE in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def tf_user_location(frame: FrameType | None = None) -> Location | None:
    """Like ``user_location``, but lines inside AutoGraph-converted code are the user's own."""
    if frame is None:
        frame = sys._getframe(1)
    if not _traced_by_autograph(frame):
        return user_location(frame)
    try:
        from tensorflow.python.util import tf_stack
    except ImportError:
        return user_location(frame)
    fallback = None
    for entry in reversed(tf_stack.extract_stack()):
        rank = rank_filename(entry.filename)
        if rank == 0:
            return Location(display_path(entry.filename), entry.lineno)
        if rank == 1 and fallback is None:
            fallback = Location(display_path(entry.filename), entry.lineno)
    return fallback or user_location(frame)


def called_from_user(frame: FrameType | None) -> bool:
    """Is the first frame outside nndoctor and the frameworks the user's (converted or not)?

    AutoGraph's ``converted_call`` sits between converted user code and the callee.
    """
    while frame is not None:
        filename = frame.f_code.co_filename
        if _AUTOGRAPH_FILE in filename:
            return True
        rank = rank_filename(filename)
        if rank != 2:
            return rank == 0
        if "autograph" not in filename and "nndoctor" not in filename:
            return False  # Keras or TensorFlow called it (fit's train step, a nested layer)
        frame = frame.f_back
    return False
