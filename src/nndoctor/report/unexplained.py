"""How an error with no known cause is shown: said plainly, with the line of the user's code.

Used by ``nndoctor run`` (a crash no explanation matched) and ``nndoctor explain`` (an error in
a log no explanation matched), so both say the same thing the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text

from nndoctor.report.capping import cap_lists
from nndoctor.util.sanitize import printable


def render_no_known_cause(console: Any, crash: Mapping[str, Any]) -> None:
    """Print the block for one unexplained error. ``crash`` holds ``type``, ``message`` (its
    first line), ``location`` (the innermost frame of the user's code, "path:line") and
    ``source`` (that frame's source line); any may be missing."""
    # Every piece comes from the traceback or a pasted log: control characters are shown escaped.
    crash = {key: printable(value, keep_newlines=False) if isinstance(value, str) else value
             for key, value in crash.items()}
    exc_type = str(crash.get("type") or "error")
    location = crash.get("location")
    head = Text()
    head.append("no known cause ", style="bold magenta")
    head.append(exc_type)
    if location:
        head.append(f"  {location}", style="cyan")
    console.print(head, soft_wrap=True)
    message = str(crash.get("message") or "")
    console.print(Text(cap_lists(f"    {exc_type}: {message}" if message else f"    {exc_type}")))
    # soft_wrap: the path:line stays on one line, clickable in terminals.
    console.print(Text("    " + where_sentence(location, crash.get("source")), style="dim"), soft_wrap=True)


def where_sentence(location: Any, source: Any) -> str:
    """The honest sentence under an unexplained error: no guess, and where to look."""
    sentence = "nndoctor's catalog (`nndoctor checks`) has no explanation for this error; "
    if location:
        line = f" `{source}`" if source else ""
        return sentence + f"it was raised from your code at {location}{line}."
    return sentence + "the traceback shows no line of your code."
