"""Is this the user's code? One answer for live frames, traceback entries and pasted tracebacks.

Findings point at the user's line, crash explanations start from the user's innermost frame,
and the tracebacks nndoctor shows leave its own frames out. All of them ask here:

- a live code object (``code_rank``): user code, a third-party library, or internal
  (torch and the other frameworks, the stdlib, nndoctor);
- a file name (``is_own_file``, ``is_tool_file``): nndoctor's own source, or also the
  ``runpy`` frames nndoctor starts the script with;
- a path read from traceback text (``is_user_path``), where no code object exists and the
  path may be from another machine.

The bundled demo script is the user's code when it runs (``nndoctor demo``). This module
imports nothing from nndoctor but ``findings`` and never imports a framework.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig
from types import CodeType, FrameType

from nndoctor.core.findings import Location

NNDOCTOR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_DIR = os.path.join(NNDOCTOR_DIR, "commands", "demo") + os.sep
_OWN_PREFIXES = tuple({NNDOCTOR_DIR + os.sep, os.path.realpath(NNDOCTOR_DIR) + os.sep})
_DEMO_PREFIXES = tuple({DEMO_DIR, os.path.realpath(DEMO_DIR) + os.sep})
# Console-script launchers (bin/nndoctor) live beside the interpreter: in a virtual environment
# that is the environment's bin/ (sys.executable as spelt), not the base interpreter's folder
# its symlink resolves to; pip may also put them in sysconfig's "scripts" path.
_LAUNCHER_DIRS = tuple({
    os.path.realpath(folder) + os.sep
    for folder in (os.path.dirname(os.path.abspath(sys.executable)), os.path.dirname(os.path.realpath(sys.executable)),
                   sysconfig.get_paths().get("scripts", ""))
    if folder
})
# nndoctor's own console scripts (pyproject's [project.scripts]), wherever an installer put them
# (pipx, --user, a wrapper folder): never the user's code.
_LAUNCHER_NAMES = frozenset({"nndoctor", "nndoctor.exe", "nndoctor-script.py", "nndoctor-script.pyw"})
_STDLIB_DIRS = tuple(
    os.path.realpath(p) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)
_LIBRARY_MARKERS = ("site-packages", "dist-packages")
# Packages whose frames are never the place to fix the user's bug.
_FRAMEWORKS = ("torch", "torchvision", "numpy", "keras", "tensorflow", "lightning", "pytorch_lightning")
# AutoGraph (tf.function) runs a converted copy of the user's function from a temporary file;
# nndoctor.keras.tf_location maps its lines back to the user's source.
_AUTOGRAPH_FILE = "__autograph_generated_file"

USER, LIBRARY, INTERNAL = 0, 1, 2


def is_own_file(filename: str) -> bool:
    """nndoctor's own source (the bundled demo excepted: it plays the user's script)."""
    # Cached by absolute path only: a relative name means another file after a chdir.
    return _is_own_absolute(os.path.abspath(filename))


@functools.lru_cache(maxsize=4096)
def _is_own_absolute(path: str) -> bool:
    for spelling in {path, os.path.realpath(path)}:
        if spelling.startswith(_DEMO_PREFIXES):
            return False
        if spelling.startswith(_OWN_PREFIXES):
            return True
    return False


def is_tool_file(filename: str) -> bool:
    """nndoctor's source, its console-script launcher or ``runpy`` (which nndoctor starts the
    script with): frames the user would not see running the script under plain python."""
    return (filename == "<frozen runpy>" or os.path.basename(filename) == "runpy.py"
            or os.path.basename(filename) in _LAUNCHER_NAMES or is_own_file(filename))


def _package_dir(name: str) -> str | None:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) if path else None


class _CodeClassifier:
    """Caches, per code object, whose code it is (cheap on hot paths)."""

    def __init__(self) -> None:
        self._cache: dict[CodeType, int] = {}
        self._internal_dirs: tuple[str, ...] | None = None

    def _dirs(self) -> tuple[str, ...]:
        # Computed on first use: the frameworks are imported by then (never imported here).
        if self._internal_dirs is None:
            dirs = [NNDOCTOR_DIR] + [d for d in map(_package_dir, _FRAMEWORKS) if d]
            self._internal_dirs = tuple(os.path.realpath(d) + os.sep for d in dirs)
        return self._internal_dirs

    def rank(self, code: CodeType) -> int:
        cached = self._cache.get(code)
        if cached is not None:
            return cached
        rank = self._cache[code] = self.rank_filename(code.co_filename)
        return rank

    def rank_filename(self, filename: str) -> int:
        if (filename.startswith("<") and filename not in ("<stdin>", "<string>")) or _AUTOGRAPH_FILE in filename:
            rank = INTERNAL
        else:
            path = os.path.realpath(filename)
            if path.startswith(_DEMO_PREFIXES):
                rank = USER
            elif (path.startswith(self._dirs()) or path.startswith(_LAUNCHER_DIRS)
                  or os.path.basename(path) in _LAUNCHER_NAMES or os.path.basename(filename) in _LAUNCHER_NAMES):
                rank = INTERNAL
            elif any(marker in path for marker in _LIBRARY_MARKERS):
                rank = LIBRARY
            elif path.startswith(_STDLIB_DIRS):
                rank = INTERNAL
            else:
                rank = USER
        return rank


_classifier = _CodeClassifier()


def code_rank(code: CodeType) -> int:
    """``USER``, ``LIBRARY`` (third-party, installed) or ``INTERNAL`` (a framework, the stdlib,
    nndoctor, Python's own ``<frozen …>`` code)."""
    return _classifier.rank(code)


def rank_filename(filename: str) -> int:
    """``code_rank`` by file name (AutoGraph's converted copies of user code are internal)."""
    return _classifier.rank_filename(filename)


def is_user_code(code: CodeType) -> bool:
    return _classifier.rank(code) == USER


def is_internal_frame(frame: FrameType) -> bool:
    return _classifier.rank(frame.f_code) == INTERNAL


def display_path(filename: str) -> str:
    """Paths under the working directory are shown relative to it, as users type them."""
    key = (filename, os.getcwd())
    shown = _DISPLAYED.get(key)
    if shown is None:  # relpath costs ~10 µs; events of every step ask for the same few files
        try:
            rel = os.path.relpath(filename)
        except ValueError:
            rel = filename
        shown = filename if rel.startswith("..") else rel
        if len(_DISPLAYED) >= 4096:
            _DISPLAYED.clear()
        _DISPLAYED[key] = shown
    return shown


_DISPLAYED: dict[tuple[str, str], str] = {}


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost user frame at or above ``frame`` (falls back to a library frame)."""
    fallback = None
    while frame is not None:
        rank = _classifier.rank(frame.f_code)
        if rank == USER:
            return frame
        if rank == LIBRARY and fallback is None:
            fallback = frame
        frame = frame.f_back
    return fallback


def user_location(frame: FrameType | None = None) -> Location | None:
    """The user's ``path:line`` at or above ``frame`` (default: the caller's frame)."""
    if frame is None:
        frame = sys._getframe(1)
    found = user_frame(frame)
    if found is None:
        return None
    return Location(display_path(found.f_code.co_filename), found.f_lineno)


_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])
# ".../lib/python3.10/…", or the same trimmed in a pasted log ("python3.8/threading.py").
_PYTHON_LIB = re.compile(r"(?:[\\/]lib[\\/]|^)python\d+(\.\d+)?[\\/]")


def is_user_path(path: str) -> bool:
    """A traceback entry's path (from text: pasted, logged, maybe from another machine) is the
    user's own code, not a library, the stdlib, nndoctor or Python's internals."""
    if not path or path.startswith("<frozen") or (path.startswith("<") and path not in ("<stdin>", "<string>")):
        return False
    if any(marker in path for marker in _LIBRARY_MARKERS):
        return False
    if _PYTHON_LIB.search(path) or re.split(r"[\\/]", path)[-1] in _LAUNCHER_NAMES:
        return False
    real = os.path.realpath(path) if os.path.isabs(path) else path
    if real.startswith(_STDLIB + os.sep):
        return False
    return not is_own_file(path)
