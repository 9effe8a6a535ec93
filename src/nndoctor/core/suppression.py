"""Suppressing findings: ``# nndoctor: ignore[CODE,...]`` comments and ``per-file-ignores``.

A comment on the line a finding is reported at silences it: ``# nndoctor: ignore[M101]``
for the listed codes (codes, prefixes like ``O1`` or names), ``# nndoctor: ignore`` for
every code. ``per-file-ignores`` in the configuration silences codes for files matching a
glob (relative to the configuration's folder). Suppressed findings leave the report's
findings (and so never trip ``--fail-on``) but are kept, with the reason, in
``Report.suppressed``. Comments that silenced nothing are "unused" and can be listed.
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import stat
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nndoctor.core.findings import Finding, Report, Suppressed

_DIRECTIVE = re.compile(r"#\s*nndoctor:\s*ignore(?:\[([^\]]*)\])?", re.IGNORECASE)


@dataclass
class Directive:
    """One suppression comment: its place and the codes it names (empty: every code)."""

    path: str
    line: int
    codes: tuple[str, ...]
    used: bool = False

    def matches(self, finding: Finding) -> bool:
        if not self.codes:
            return True
        return any(_selector_matches(finding, c) for c in self.codes)

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "line": self.line, "codes": list(self.codes)}

    def __str__(self) -> str:
        what = f"ignore[{','.join(self.codes)}]" if self.codes else "ignore"
        return f"{self.path}:{self.line}: unused suppression '# nndoctor: {what}'"


def _selector_matches(finding: Finding, selector: str) -> bool:
    selector = selector.strip()
    if not selector:
        return False
    return finding.name == selector.lower() or finding.code.startswith(selector.upper())


def directives_in_source(source: str, path: str) -> dict[int, Directive]:
    """Line -> directive, from comments only (a ``#`` inside a string is not a comment)."""
    found: dict[int, Directive] = {}
    if "nndoctor" not in source:
        return found
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return found
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        match = _DIRECTIVE.search(token.string)
        if match:
            codes = tuple(c.strip() for c in (match.group(1) or "").split(",") if c.strip())
            found[token.start[0]] = Directive(path, token.start[0], codes)
    return found


# A Python file larger than this is not read for comments (a generated or hostile file).
_MAX_SOURCE_BYTES = 16 * 2**20


def _python_source(path: str) -> str:
    """The text of a regular ``.py`` file, or "" — never opens a FIFO or device (a finding's
    location can name any path: a data file, a path from a pasted log)."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_SOURCE_BYTES:
            return ""
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return ""


class DirectiveIndex:
    """Directives per file, read once per file."""

    def __init__(self) -> None:
        self._files: dict[str, dict[int, Directive]] = {}

    def for_file(self, path: str) -> dict[int, Directive]:
        key = os.path.abspath(path)
        if key not in self._files:
            self._files[key] = directives_in_source(_python_source(key), path) if key.endswith(".py") else {}
        return self._files[key]

    def all(self) -> list[Directive]:
        return [d for directives in self._files.values() for d in directives.values()]


def per_file_reason(path: str, per_file_ignores: dict[str, list[str]], root: Path,
                    finding: Finding, config_name: str) -> str | None:
    """The per-file-ignores entry that silences ``finding`` at ``path``, as a reason, or None."""
    absolute = os.path.abspath(path)
    try:
        relative = Path(absolute).relative_to(root).as_posix()
    except ValueError:
        relative = Path(path).as_posix()
    for pattern, codes in per_file_ignores.items():
        if not (fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(absolute, pattern)):
            continue
        if any(_selector_matches(finding, c) for c in codes):
            return f"per-file-ignores {pattern!r} in {config_name}"
    return None


def apply_suppressions(
    report: Report,
    *,
    per_file_ignores: dict[str, list[str]] | None = None,
    root: Path | None = None,
    config_name: str = "pyproject.toml",
    also_scan: Iterable[str] = (),
) -> list[Directive]:
    """Move suppressed findings from ``report.findings`` to ``report.suppressed``.

    Returns the unused directives of every file that was looked at (the files of the
    findings, plus ``also_scan``, e.g. the script itself).
    """
    index = DirectiveIndex()
    root = root or Path.cwd()
    kept: list[Finding] = []
    for finding in report.findings:
        location = finding.location
        reason = None
        if location is not None and location.path and not location.path.startswith("<"):
            directive = index.for_file(location.path).get(location.line or -1)
            if directive is not None and directive.matches(finding):
                directive.used = True
                reason = f"comment at {location.path}:{location.line}"
            elif per_file_ignores:
                reason = per_file_reason(location.path, per_file_ignores, root, finding, config_name)
        if reason is None:
            kept.append(finding)
        else:
            report.suppressed.append(Suppressed(finding, reason))
    report.findings = kept
    for path in also_scan:
        if path and os.path.isfile(path):
            index.for_file(path)
    return [d for d in index.all() if not d.used]
