"""Make untrusted text safe to print on a terminal: control characters become visible escapes.

Key names, metadata, file names and log lines come from files nndoctor did not write. Printed raw,
an ESC/CSI/OSC sequence in them can recolour, hide or rewrite what the terminal shows (or, on some
terminals, set the window title or clipboard): see "Terminal escape injection", CWE-150,
https://cwe.mitre.org/data/definitions/150.html. The terminal gets an escaped copy; JSON reports keep
the raw value (JSON escapes control characters itself).
"""

from __future__ import annotations

import re

__all__ = ["printable"]

# C0 controls (except \t and \n, handled by the flags), DEL, C1 controls, and the Unicode line/paragraph
# separators and bidi overrides that can make printed text read differently from what it is.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    code = ord(char)
    if code == 0x1B:
        return "\\e"
    if code == 0x0D:
        return "\\r"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def printable(text: object, *, keep_newlines: bool = True, keep_tabs: bool = True) -> str:
    """Return ``text`` with every control character replaced by a visible escape such as ``\\e`` or ``\\x07``.

    ``\\n`` and ``\\t`` are kept by default (log lines and multi-line messages); pass
    ``keep_newlines=False`` for single-line values such as key or file names. Non-strings are passed
    through ``str()`` first. Plain text comes back unchanged.
    """
    text = text if isinstance(text, str) else str(text)
    if not keep_newlines:
        text = text.replace("\n", "\\n")
    if not keep_tabs:
        text = text.replace("\t", "\\t")
    return _UNSAFE.sub(_escape, text)
