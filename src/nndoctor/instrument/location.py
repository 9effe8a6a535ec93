"""Attributing an event to the user's code: the first frame outside torch, nndoctor and the stdlib."""

from __future__ import annotations

import os
import sys
import sysconfig
from types import CodeType, FrameType

from nndoctor.findings import Location

_NNDOCTOR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The bundled demo script is "user code" for the demo's findings.
_DEMO_DIR = os.path.join(_NNDOCTOR_DIR, "demo") + os.sep
# Console-script launchers (bin/nndoctor) live beside the interpreter.
_LAUNCHER_DIR = os.path.dirname(os.path.realpath(sys.executable)) + os.sep
# AutoGraph (tf.function) runs a converted copy of the user's function from a temporary file.
_AUTOGRAPH_FILE = "__autograph_generated_file"
_STDLIB_DIRS = tuple(
    os.path.realpath(p) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)


def _package_dir(name: str) -> str | None:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) if path else None


class _FrameClassifier:
    """Caches, per code object, whether a frame belongs to the user (cheap on hot paths)."""

    def __init__(self) -> None:
        self._cache: dict[CodeType, int] = {}
        self._framework_dirs: tuple[str, ...] | None = None

    def _dirs(self) -> tuple[str, ...]:
        if self._framework_dirs is None:
            dirs = [_NNDOCTOR_DIR]
            for name in ("torch", "torchvision", "numpy", "keras", "tensorflow", "lightning", "pytorch_lightning"):
                found = _package_dir(name)
                if found:
                    dirs.append(found)
            self._framework_dirs = tuple(os.path.realpath(d) + os.sep for d in dirs)
        return self._framework_dirs

    def rank(self, code: CodeType) -> int:
        """0: user code; 1: a third-party library; 2: framework, stdlib or nndoctor."""
        cached = self._cache.get(code)
        if cached is not None:
            return cached
        rank = self.rank_filename(code.co_filename)
        self._cache[code] = rank
        return rank

    def rank_filename(self, filename: str) -> int:
        if filename.startswith("<") and filename not in ("<stdin>", "<string>"):
            rank = 2
        elif _AUTOGRAPH_FILE in filename:
            rank = 2  # tf.function's converted copy of user code: nndoctor.keras.tf_location maps it back
        else:
            path = os.path.realpath(filename)
            if path.startswith(_DEMO_DIR):
                rank = 0
            elif path.startswith(self._dirs()) or path.startswith(_LAUNCHER_DIR):
                rank = 2
            elif "site-packages" in path or "dist-packages" in path:
                rank = 1
            elif path.startswith(_STDLIB_DIRS):
                rank = 2
            else:
                rank = 0
        return rank


_classifier = _FrameClassifier()


def rank_filename(filename: str) -> int:
    """0: user code; 1: a third-party library; 2: framework, stdlib, nndoctor (by file name)."""
    return _classifier.rank_filename(filename)


def display_path(filename: str) -> str:
    """Paths under the working directory are shown relative to it, as users type them."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost user frame at or above ``frame`` (falls back to a library frame)."""
    fallback = None
    while frame is not None:
        rank = _classifier.rank(frame.f_code)
        if rank == 0:
            return frame
        if rank == 1 and fallback is None:
            fallback = frame
        frame = frame.f_back
    return fallback


def user_location(frame: FrameType | None = None) -> Location | None:
    if frame is None:
        frame = sys._getframe(1)
    found = user_frame(frame)
    if found is None:
        return None
    return Location(display_path(found.f_code.co_filename), found.f_lineno)


def location_of_traceback(tb) -> Location | None:
    """The innermost user frame of a traceback (where the user's code called into the failure)."""
    best = None
    fallback = None
    while tb is not None:
        rank = _classifier.rank(tb.tb_frame.f_code)
        if rank == 0:
            best = Location(display_path(tb.tb_frame.f_code.co_filename), tb.tb_lineno)
        elif rank == 1:
            fallback = Location(display_path(tb.tb_frame.f_code.co_filename), tb.tb_lineno)
        tb = tb.tb_next
    return best or fallback


def is_internal_frame(frame: FrameType) -> bool:
    return _classifier.rank(frame.f_code) == 2


_MODULE_CALL_FILE = os.path.join("torch", "nn", "modules", "module.py")
# ``OptimizedModule.__call__`` (torch.compile) sits between the user and the module call.
_COMPILED_CALL_FILE = os.path.join("torch", "_dynamo", "eval_frame.py")


def direct_caller(frame: FrameType | None) -> FrameType | None:
    """The frame that called a module (skipping nndoctor's hooks and torch's call machinery)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        own = filename.startswith(_NNDOCTOR_DIR) and not filename.startswith(_DEMO_DIR)
        if own or filename.endswith((_MODULE_CALL_FILE, _COMPILED_CALL_FILE)):
            frame = frame.f_back
            continue
        return frame
    return None


def called_from_framework(frame: FrameType | None) -> bool:
    """True when the direct caller is torch itself (e.g. ``swa_utils.update_bn``)."""
    caller = direct_caller(frame)
    return caller is not None and _classifier.rank(caller.f_code) == 2
