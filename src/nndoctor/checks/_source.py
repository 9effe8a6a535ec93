"""Source-aware locations: where in the user's code an attribute of their model is defined."""

from __future__ import annotations

import linecache
import re
from typing import Any

from nndoctor.core.findings import Location
from nndoctor.core.user_code import display_path


def attribute_definition(root: Any, qualified_name: str) -> Location | None:
    """The ``self.<attr> = ...`` line in ``__init__`` that creates the top-level submodule
    holding a parameter (``qualified_name`` is relative to ``root``, e.g. ``skip.weight``).

    Reads the source through the code object of ``__init__`` (works for classes defined in
    a script that has finished running), and only answers when the assignment is there.
    """
    attr = qualified_name.split(".", 1)[0]
    pattern = re.compile(rf"\bself\.{re.escape(attr)}\s*(?::[^=]+)?=(?!=)")
    for cls in type(root).__mro__:
        if cls.__module__.startswith("torch"):
            break
        init = cls.__dict__.get("__init__")
        code = getattr(init, "__code__", None)
        if code is None:
            continue
        lines = [line for _, _, line in code.co_lines() if line]
        if not lines:
            continue
        for number in range(code.co_firstlineno, max(lines) + 1):
            if pattern.search(linecache.getline(code.co_filename, number)):
                return Location(display_path(code.co_filename), number)
    return None
