"""From a report's findings to edits: which files may be edited, one codemod per finding.

Each codemod runs on the file's original text, so every edit is a set of hunks against the
original; edits that touch the same lines as an earlier one wait for the next ``nndoctor fix``.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterable

from nndoctor.commands.fix.codemods import codemod_for
from nndoctor.commands.fix.edit import SUGGESTION, Edit, hunks_between
from nndoctor.commands.fix.syntax import FixContext, Uncertain
from nndoctor.core.findings import Finding, Report

_LIBRARY_DIRS = ("site-packages", "dist-packages")


def refusal(path: str, project_root: str, named: Iterable[str]) -> str | None:
    """Why ``path`` must not be edited (an installed library, outside the project), or None."""
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    if any(part in _LIBRARY_DIRS for part in parts):
        return "the code is inside an installed library (site-packages): fix it in your own code or upstream"
    for key in ("stdlib", "platstdlib"):
        lib = os.path.realpath(sysconfig.get_paths()[key])
        if real.startswith(lib + os.sep):
            return "the code is in Python's standard library"
    own = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    if real.startswith(own + os.sep):
        return "the code is nndoctor's own"
    if not os.path.isfile(real):
        return "the file does not exist any more"
    if not os.access(real, os.W_OK):
        return "the file is not writable"
    root = os.path.realpath(project_root)
    if not real.startswith(root + os.sep) and real not in {os.path.realpath(n) for n in named}:
        return f"the file is outside the project ({root}); fix it by hand or run nndoctor fix from its project"
    return None


def _fixable(report: Report) -> list[Finding]:
    found = [f for f in report.findings
             if f.location is not None and f.location.line and codemod_for(f.code) is not None]
    return sorted(found, key=lambda f: (f.location.path, f.location.line or 0, f.code))  # type: ignore[union-attr]


def plan_file(path: str, source: str, findings: list[Finding], *, unsafe: bool,
              display_path: str = "") -> list[Edit]:
    """Edits (and suggestions) for the findings of one file, against its text ``source``."""
    edits: list[Edit] = []
    for finding in findings:
        module = codemod_for(finding.code)
        assert module is not None and finding.location is not None and finding.location.line
        edit = Edit(code=finding.code, path=path, title="", finding=finding, safe=bool(module.SAFE),
                    display_path=display_path or finding.location.path, findings=[finding])
        try:
            ctx = FixContext(source, finding.location.line, finding, path)
            new_source, edit.title = module.propose(ctx)
        except Uncertain as uncertain:
            edit.status, edit.reason, edit.title = SUGGESTION, uncertain.reason, finding.fix
            edits.append(edit)
            continue
        except Exception as error:  # noqa: BLE001 - a codemod's failure becomes a suggestion, never a crash
            edit.status, edit.title = SUGGESTION, finding.fix
            edit.reason = f"nndoctor could not build this edit ({type(error).__name__}: {error})"
            edits.append(edit)
            continue
        edit.hunks = hunks_between(source, new_source)
        if not edit.hunks:
            continue
        same = next((e for e in edits if e.code == edit.code and e.hunks == edit.hunks), None)
        if same is not None:  # two findings answered by one edit (R101 at two lines)
            same.findings.append(finding)
            continue
        if not edit.safe and not unsafe:
            edit.status = SUGGESTION
            edit.reason = f"unsafe fix ({getattr(module, 'UNSAFE_REASON', '')}); --unsafe-fixes applies it"
        else:
            clash = next((e for e in edits if not e.is_suggestion
                          and any(h.overlaps(o) for h in edit.hunks for o in e.hunks)), None)
            if clash is not None:
                edit.status = SUGGESTION
                edit.reason = f"it touches the lines of the {clash.code} edit: run nndoctor fix again after that one"
        edits.append(edit)
    return edits


def plan_edits(report: Report, *, project_root: str, named: Iterable[str] = (), unsafe: bool = False) -> list[Edit]:
    """Every edit and suggestion for the report's fixable findings."""
    by_file: dict[str, list[Finding]] = {}
    for finding in _fixable(report):
        assert finding.location is not None
        by_file.setdefault(os.path.abspath(finding.location.path), []).append(finding)
    edits: list[Edit] = []
    named = list(named)
    for path, findings in by_file.items():
        why_not = refusal(path, project_root, named)
        source = None
        if why_not is None:
            try:
                with open(path, encoding="utf-8", newline="") as handle:
                    source = handle.read()
            except (OSError, UnicodeDecodeError) as error:
                why_not = f"the file cannot be read as UTF-8 text ({error})"
        if source is None:
            edits += [Edit(code=f.code, path=path, title=f.fix, finding=f, status=SUGGESTION, reason=str(why_not),
                           display_path=f.location.path if f.location else path, findings=[f]) for f in findings]
            continue
        edits += plan_file(path, source, findings, unsafe=unsafe)
    return edits


