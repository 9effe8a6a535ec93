"""Static scan of pickle opcodes: which globals a file would import, found without running it.

Unpickling calls whatever callables the pickle names, so the only safe way to judge a file is
to read its opcodes first. This module never unpickles anything.
"""

from __future__ import annotations

import io
import pickletools
from dataclasses import dataclass, field
from typing import IO, Any

# Globals that are known to run commands or touch files. This is NOT what decides whether a file
# is unsafe (allowlist.py does: anything outside it is an error); it only lets the message name
# the worst offenders first.
_DANGEROUS_MODULES = {
    "os", "posix", "nt", "subprocess", "sys", "shutil", "socket", "pty", "runpy",
    "importlib", "ctypes", "marshal", "pickle", "_pickle", "dill", "code", "codeop",
    "webbrowser", "urllib", "requests", "http", "commands", "multiprocessing",
    "timeit", "pdb", "bdb", "profile", "cProfile", "trace", "operator", "functools", "copyreg",
    "types", "inspect", "threading", "asyncio", "tempfile", "glob", "io", "_io", "zipimport",
}
_DANGEROUS_BUILTINS = {
    "eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "__import__",
    "globals", "locals", "vars", "input", "breakpoint", "apply", "execfile",
}

UNRESOLVED = "<unresolved STACK_GLOBAL>"


def python3_name(module: str, name: str) -> str:
    """``__builtin__.set`` -> ``builtins.set``: the renames pickle applies for protocols < 3."""
    import _compat_pickle

    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}"


class PickleCorrupt(ValueError):
    """The bytes are not a complete, well-formed pickle.

    ``found`` keeps the globals seen before the damage: a hostile file that is also broken must
    still be reported as hostile.
    """

    def __init__(self, message: str, found: PickleGlobals | None = None) -> None:
        super().__init__(message)
        self.found = found if found is not None else PickleGlobals()


# First bytes of protocol 0/1 pickles (text opcodes, no \x80 PROTO header): MARK, EMPTY_DICT,
# EMPTY_LIST, EMPTY_TUPLE, GLOBAL, INST, INT, LONG, FLOAT, STRING, UNICODE, NONE, PERSID, and
# the protocol 1 binary forms (BININT*, BINSTRING, BINUNICODE, BINFLOAT).
_TEXT_PICKLE_STARTS = frozenset(b"(}])ciILFSVNPJKMTUXGN")


def looks_like_pickle(head: bytes) -> bool:
    """Cheap test on the first bytes: a protocol 2+ header, or a plausible protocol 0/1 opcode.

    A match only means "worth scanning": scan_pickle decides.
    """
    if head[:1] == b"\x80":
        return len(head) < 2 or head[1] <= pickle_highest()
    return bool(head) and head[0] in _TEXT_PICKLE_STARTS


def pickle_highest() -> int:
    import pickle

    return pickle.HIGHEST_PROTOCOL


@dataclass
class PickleGlobals:
    """The globals a pickle references, in order of first appearance."""

    names: list[str] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set, repr=False)

    def add(self, name: str) -> None:
        # A set, not ``name in self.names``: a hostile pickle can name a million globals.
        if name not in self._seen:
            self._seen.add(name)
            self.names.append(name)


def is_dangerous(global_name: str) -> bool:
    """True for globals whose call can run commands, import code or touch files."""
    if global_name == UNRESOLVED or global_name.startswith("<"):
        return True
    module, _, name = global_name.rpartition(".")
    top = module.split(".")[0]
    if module in ("builtins", "__builtin__"):
        return name in _DANGEROUS_BUILTINS
    if module.startswith("numpy.testing") or module.startswith("numpy.distutils"):
        return True  # string runners (numpy.testing._private.utils.runstring)
    return top in _DANGEROUS_MODULES


def scan_pickle(data: bytes | IO[bytes], *, max_pickles: int = 1) -> tuple[PickleGlobals, int]:
    """Globals referenced by up to ``max_pickles`` consecutive pickles at the start of ``data``.

    Returns the globals and the number of pickles read. Raises PickleCorrupt when the first
    pickle is malformed or truncated; a malformed later pickle ends the scan (the legacy
    torch format stores raw tensor bytes after its pickles).
    """
    stream = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    found = PickleGlobals()
    count = 0
    while count < max_pickles:
        start = stream.tell()
        if not stream.read(1):
            break
        stream.seek(start)
        try:
            _scan_one(stream, found)
        except PickleCorrupt as error:
            if count == 0:
                raise PickleCorrupt(str(error), found) from None
            break
        count += 1
    if count == 0:
        raise PickleCorrupt("empty file: no pickle data", found)
    return found, count


def _scan_one(stream: IO[bytes], found: PickleGlobals) -> None:
    # Strings are tracked through the memo because STACK_GLOBAL takes its module and name
    # from the stack, where they often arrive via BINGET of an earlier string.
    memo: dict[int, object] = {}
    recent: list[object] = []
    next_memo = 0
    saw_stop = False
    arg: Any  # the opcode's argument: a string, a number or None, by opcode
    try:
        for opcode, arg, _pos in pickletools.genops(stream):
            name = opcode.name
            if name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                found.add(python3_name(module, attr))
                recent.append(None)
            elif name == "STACK_GLOBAL":
                if len(recent) >= 2 and isinstance(recent[-2], str) and isinstance(recent[-1], str):
                    found.add(python3_name(recent[-2], recent[-1]))
                else:
                    found.add(UNRESOLVED)
                recent.append(None)
            elif name in ("EXT1", "EXT2", "EXT4"):
                found.add(f"<copyreg extension {arg}>")
                recent.append(None)
            elif name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE",
                          "SHORT_BINSTRING", "BINSTRING", "STRING"):
                recent.append(arg)
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg)] = recent[-1] if recent else None
            elif name == "MEMOIZE":
                memo[next_memo] = recent[-1] if recent else None
                next_memo += 1
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                recent.append(memo.get(int(arg)))
            elif name == "STOP":
                saw_stop = True
            else:
                recent.append(None)
            if len(recent) > 64:
                del recent[:-8]
    except Exception as error:  # noqa: BLE001 - genops raises ValueError, EOFError, struct errors …
        raise PickleCorrupt(f"malformed or truncated pickle: {error}") from None
    if not saw_stop:
        raise PickleCorrupt("truncated pickle: no STOP opcode")
