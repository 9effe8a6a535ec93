"""Explanations of environment crashes: E119 a local file shadowing a module, E127 argparse in a
notebook, E128 a relative path resolved against the wrong working directory."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation
from nndoctor.commands.explain.crash import Crash
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register


def is_known_module_name(name: str) -> str | None:
    """``"stdlib"`` or ``"installed"`` when a module of that name exists outside the user's
    folders (so a local file of the same name shadows it), else None."""
    top = name.split(".")[0]
    if top in getattr(sys, "stdlib_module_names", ()):
        return "stdlib"
    try:
        from importlib.metadata import packages_distributions

        if top in packages_distributions():
            return "installed"
    except Exception:  # noqa: BLE001
        pass
    return None


def local_shadow(name: str, folders: list[str]) -> str | None:
    """A ``name.py`` file or ``name/`` folder (without __init__.py it still imports) in ``folders``."""
    top = name.split(".")[0]
    for folder in folders:
        for candidate in (os.path.join(folder, top + ".py"), os.path.join(folder, top)):
            if os.path.isfile(candidate) or (os.path.isdir(candidate) and candidate.endswith(top)):
                return candidate
    return None


def _user_folders(crash: Crash) -> list[str]:
    folders: list[str] = []
    for frame in crash.frames:
        path = _usable_path(frame.path, crash)
        if frame.is_user and path:
            folder = os.path.dirname(path)
            if folder not in folders:
                folders.append(folder)
    if crash.is_live and os.getcwd() not in folders:
        folders.append(os.getcwd())
    return folders


@register
class ModuleNotFoundShadowing(CrashExplanation):
    """
    ## What it does
    Explains "No module named 'X.Y'; 'X' is not a package", "cannot import name 'f' from 'X'
    (/project/X.py)" and "module 'X' has no attribute 'f'" when ``X`` resolves to a file in the
    user's own folder that hides the standard-library or installed module of the same name.

    ## Why is this bad?
    The script's folder comes first on ``sys.path``. A helper named ``pdb.py``, ``random.py``,
    ``datasets.py`` or ``torch.py`` is imported instead of the real module, and the error
    blames the import, not the file name.

    ## Example
    ```text
    project/
      train.py        # from datasets.utils import ...
      datasets.py     # your own helpers
    ```

    ## Use instead
    Rename the local file (``my_datasets.py``) and delete its ``__pycache__`` entry.

    ## References
    - Python docs, "The module search path" (sys.path[0] is the script's folder).
    """

    code = "E119"
    name = "module-not-found-shadowing"
    summary = "a file beside the script hides the module of the same name"
    fix = "rename the local file (and remove its __pycache__ entry) so the real module is imported"
    patterns = (
        r"No module named '(?P<missing>[\w.]+)'; '(?P<shadow>[\w.]+)' is not a package",
        r"cannot import name '(?P<name>\w+)' from (?:partially initialized module )?'(?P<module>[\w.]+)' \((?P<path>[^)]+)\)",
        r"(?:partially initialized )?module '(?P<module2>[\w.]+)' has no attribute '(?P<name2>\w+)'",
        r"No module named '(?P<module3>[\w.]+)'",
    )
    order = 30

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        facts = super().match(crash)
        if facts is None:
            return None
        # One of the patterns' groups matched: a module name.
        module: Any = facts.get("shadow") or facts.get("module") or facts.get("module2") or facts.get("module3")
        path = facts.get("path") or _module_file(module)
        if path is None or not os.path.basename(path).startswith(module.split(".")[0]):
            if "shadow" not in facts:
                return None
        kind = is_known_module_name(module)
        if "shadow" in facts or (path and kind and _is_users_file(path, crash)):
            facts["resolved"] = module
            if path:
                facts["file"] = path
            facts["kind"] = kind or "package"
            return facts
        return None

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        module = facts["resolved"]
        path = facts.get("file") or local_shadow(module, _user_folders(crash))
        evidence: dict[str, Any] = {"module": module}
        if path:
            evidence["shadowing_file"] = path
        kind = {"stdlib": "the standard-library module", "installed": "the installed package"}.get(
            facts.get("kind", ""), "the package")
        where = path or f"a file named {module.split('.')[0]}.py near the script"
        message = f"`import {module.split('.')[0]}` found {where} instead of {kind} `{module.split('.')[0]}`."
        if facts.get("missing"):
            message += f" That file is not a package, so '{facts['missing']}' cannot be imported from it."
        fix = f"rename {path or where} (e.g. to my_{module.split('.')[0]}.py) and delete its __pycache__ entry"
        return cls.make(crash, message, fix=fix, evidence=evidence)


def _module_file(name: str | None) -> str | None:
    module = sys.modules.get(name or "")
    return getattr(module, "__file__", None)


def _is_users_file(path: str, crash: Crash) -> bool:
    if "site-packages" in path or "dist-packages" in path:
        return False
    stdlib = os.path.dirname(os.__file__)
    if os.path.realpath(path).startswith(os.path.realpath(stdlib) + os.sep):
        return False
    return True


@register
class NotebookArgv(CrashExplanation):
    """
    ## What it does
    Explains argparse failing inside Jupyter: "error: unrecognized arguments: -f
    /…/kernel-….json" followed by ``SystemExit: 2``. The kernel's own command line is in
    ``sys.argv``, and ``parse_args()`` reads it.

    ## Why is this bad?
    Training code copied from a script into a notebook cannot start; the ``SystemExit`` looks
    like the program chose to exit.

    ## Example
    ```python
    args = parser.parse_args()        # in a notebook cell
    ```

    ## Use instead
    ```python
    args = parser.parse_args(args=[])               # defaults
    args = parser.parse_args(["--lr", "0.1"])       # or explicit values
    args, _ = parser.parse_known_args()             # ignore the kernel's arguments
    ```

    ## References
    - Python docs, `argparse.ArgumentParser.parse_known_args`: https://docs.python.org/3/library/argparse.html#partial-parsing
    """

    code = "E127"
    name = "notebook-argv"
    summary = "argparse parsed the Jupyter kernel's own arguments"
    fix = "in a notebook call parser.parse_args(args=[]) (or parse_known_args()[0])"
    patterns = (r"unrecognized arguments:.*?(?P<kernel>-f\s+\S*kernel[-\w]*\.json)",
                r"(?P<kernel2>ipykernel_launcher(?:\.py)?): error:")
    order = 20

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        facts = super().match(crash)
        if facts is not None:
            return facts
        if crash.is_live and crash.short_type == "SystemExit":
            argv = " ".join(sys.argv)
            if re.search(r"-f\s+\S*kernel[-\w]*\.json", argv) or "ipykernel" in (sys.argv[0] if sys.argv else ""):
                return {"kernel": argv}
        return None

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        kernel = facts.get("kernel") or facts.get("kernel2")
        evidence: dict[str, Any] = {"kernel_arguments": kernel} if kernel else {}
        message = ("argparse read the Jupyter kernel's command line"
                   + (f" ({kernel})" if kernel else "")
                   + " as the script's arguments and exited: in a notebook sys.argv belongs to the kernel.")
        return cls.make(crash, message, evidence=evidence)


@register
class RelativePathCwd(CrashExplanation):
    """
    ## What it does
    Explains ``FileNotFoundError`` for a relative path (``data/train.csv``) that does exist
    relative to the script's folder but not relative to the working directory the script
    was started from; shows both folders.

    ## Why is this bad?
    Relative paths are resolved against the current working directory, not the script's
    location. ``python train.py`` works from the project folder and fails from anywhere else
    (a scheduler, an IDE, ``python project/train.py``).

    ## Example
    ```python
    df = pd.read_csv("data/train.csv")
    ```

    ## Use instead
    ```python
    from pathlib import Path
    HERE = Path(__file__).resolve().parent
    df = pd.read_csv(HERE / "data" / "train.csv")
    ```

    ## References
    - Python docs, `pathlib.Path(__file__).parent` to build paths relative to the script: https://docs.python.org/3/library/pathlib.html
    """

    code = "E128"
    name = "relative-path-cwd"
    summary = "a relative path that exists next to the script, not in the working directory"
    fix = "build the path from the script's folder: Path(__file__).resolve().parent / 'data/...'"
    patterns = (r"No such file or directory: '(?P<path>[^'/][^']*)'",)
    order = 40

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        facts = super().match(crash)
        if facts is None or os.path.isabs(facts["path"]):
            return None
        script_dir = _script_folder(crash)
        if script_dir is None:
            return None
        candidate = os.path.join(script_dir, facts["path"])
        cwd = os.getcwd()
        if os.path.exists(candidate) and os.path.realpath(script_dir) != os.path.realpath(cwd):
            facts.update({"script_dir": script_dir, "resolved": candidate, "cwd": cwd})
            return facts
        return None

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        path = facts["path"]
        evidence = {"path": path, "working_directory": facts["cwd"], "exists_at": facts["resolved"]}
        message = (f"'{path}' is relative, so it was looked up in the working directory {facts['cwd']}; "
                   f"it exists next to the script, at {facts['resolved']}.")
        parts = ", ".join(repr(p) for p in path.replace("\\", "/").split("/"))
        fix = f"use `Path(__file__).resolve().parent.joinpath({parts})`, or run the script from {facts['script_dir']}"
        return cls.make(crash, message, fix=fix, evidence=evidence)


def _script_folder(crash: Crash) -> str | None:
    """The folder of the outermost user frame (the script that was run)."""
    for frame in crash.frames:
        path = _usable_path(frame.path, crash)
        if frame.is_user and path and os.path.exists(path):
            return os.path.dirname(path)
    return None


def _usable_path(path: str, crash: Crash) -> str | None:
    """An absolute path for a frame: relative names are only trusted on a live run (where
    they are relative to this process's working directory)."""
    if os.path.isabs(path):
        return path
    return os.path.abspath(path) if crash.is_live else None
