"""Keeping nndoctor's own start-up away from the user's files.

``python -m nndoctor`` puts the working directory first on ``sys.path`` (Python docs, "-m":
"the current directory will be added to the start of sys.path"), so a user's ``inspect.py``,
``argparse.py`` or ``json.py`` there would be imported by nndoctor itself (``dataclasses``
imports ``inspect``) and break it with a misleading error before any argument is read.

While ``-m`` is still locating the package, ``sys.argv[0]`` is ``"-m"``; then, and only then,
the working directory's slot is taken by the folder nndoctor is installed in (already on the
path, so nothing new becomes importable). The slot itself stays: the runner puts the script's
folder there, as ``python train.py`` does, so the user's script sees the ``sys.path`` it
expects — and R102 still reports the shadowing file beside it.
"""

from __future__ import annotations

import os
import sys


def protect_own_imports() -> bool:
    """Take the working directory out of ``sys.path[0]`` when started by ``-m``; True if done."""
    if sys.argv[:1] != ["-m"] or not sys.path:
        return False
    first = sys.path[0]
    try:
        is_cwd = first == "" or os.path.realpath(first) == os.path.realpath(os.getcwd())
    except OSError:  # the working directory was deleted: nothing there to shadow anything
        return False
    if not is_cwd:
        return False
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return True


protect_own_imports()
