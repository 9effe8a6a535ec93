"""``nndoctor fix notebook.ipynb``: the code cells run as one script; edits go back cell by cell.

The code cells are joined into a hidden script beside the notebook (``.NAME.nndoctor.py``), one
marker comment between cells, IPython magics (``%…``, ``!…``) turned into ``pass`` so the
script parses and runs. The doctor runs that script, the codemods edit it, and the edited text
is split back at the markers: only the cells whose code changed are rewritten, magics restored;
markdown cells, outputs and metadata are left as they were.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nndoctor.commands.fix.files import BACKUP_SUFFIX
from nndoctor.core.findings import Location, Report
from nndoctor.util.atomic import atomic_write_text
from nndoctor.util.errors import UsageError

_MARKER = "# nndoctor-fix cell {}"
_MARKER_RE = re.compile(r"^# nndoctor-fix cell (\d+)$")
_MAGIC = re.compile(r"^(\s*)[%!]")


@dataclass
class NotebookScript:
    """A notebook's code cells as one script, and the way back."""

    path: str
    notebook: dict[str, Any]
    script: str = ""
    # script line (1-based) -> (cell index, line in the cell, 1-based)
    lines: dict[int, tuple[int, int]] = field(default_factory=dict)
    magics: dict[tuple[int, int], str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: str) -> NotebookScript:
        try:
            with open(path, encoding="utf-8") as handle:
                notebook = json.load(handle)
            cells = notebook["cells"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise UsageError(f"can't read notebook {path!r}: {error}") from None
        self = cls(os.path.abspath(path), notebook)
        out: list[str] = []
        for index, cell in enumerate(cells):
            if cell.get("cell_type") != "code":
                continue
            out.append(_MARKER.format(index))
            for number, line in enumerate(_source(cell).splitlines(), start=1):
                if _MAGIC.match(line):
                    self.magics[(index, number)] = line
                    line = _MAGIC.match(line).group(1) + "pass  # magic"  # type: ignore[union-attr]
                out.append(line)
                self.lines[len(out)] = (index, number)
        self.script = "\n".join(out) + "\n"
        return self

    @property
    def script_path(self) -> str:
        folder, name = os.path.split(self.path)
        return os.path.join(folder, f".{os.path.splitext(name)[0]}.nndoctor.py")

    def cells_of(self, script: str) -> dict[int, str]:
        """Cell index -> its code, from an (edited) script; magics restored."""
        cells: dict[int, list[str]] = {}
        current = None
        for line in script.splitlines():
            match = _MARKER_RE.match(line)
            if match:
                current = int(match.group(1))
                cells[current] = []
            elif current is not None:
                cells[current].append(line)
        result = {}
        for index, lines in cells.items():
            old = _source(self.notebook["cells"][index]).splitlines()
            restored = [self.magics.get((index, n), line) if line.strip() == "pass  # magic" else line
                        for n, line in enumerate(lines, start=1)]
            # An edit that moved lines past a magic one would restore it in the wrong place.
            if [line for line in restored if _MAGIC.match(line)] != [line for line in old if _MAGIC.match(line)]:
                raise UsageError(f"an edit of cell {index} moved IPython magic lines; fix that cell by hand")
            result[index] = "\n".join(restored)
        return result

    def changed_cells(self, script: str) -> dict[int, str]:
        return {i: code for i, code in self.cells_of(script).items()
                if code.rstrip("\n") != _source(self.notebook["cells"][i]).rstrip("\n")}

    def cell_diff(self, script: str, shown: str) -> str:
        out: list[str] = []
        for index, code in sorted(self.changed_cells(script).items()):
            old = _source(self.notebook["cells"][index]).rstrip("\n").splitlines(keepends=False)
            new = code.rstrip("\n").splitlines(keepends=False)
            out.extend(line + "\n" for line in difflib.unified_diff(
                old, new, fromfile=f"a/{shown} (cell {index + 1})", tofile=f"b/{shown} (cell {index + 1})",
                lineterm=""))
        return "".join(out)

    def write_back(self, script: str, keep_backup: bool) -> list[int]:
        """Rewrite the changed cells in the notebook file (atomically); their indexes."""
        changed = self.changed_cells(script)
        if not changed:
            return []
        if keep_backup:
            with open(self.path, encoding="utf-8") as handle:
                atomic_write_text(self.path + BACKUP_SUFFIX, handle.read())
        for index, code in changed.items():
            lines = code.split("\n")
            self.notebook["cells"][index]["source"] = [line + "\n" for line in lines[:-1]] + [lines[-1]]
        atomic_write_text(self.path, json.dumps(self.notebook, indent=1, ensure_ascii=False) + "\n")
        return sorted(changed)

    def locate(self, location: Location | None, shown: str) -> Location | None:
        """A location in the hidden script as the notebook's cell and line."""
        if location is None or os.path.abspath(location.path) != self.script_path or location.line is None:
            return location
        cell = self.lines.get(location.line)
        if cell is None:
            return Location(shown, None)
        return Location(f"{shown} (cell {cell[0] + 1})", cell[1])


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


@contextlib.contextmanager
def script_for(path: str) -> Iterator[NotebookScript]:
    """The notebook's hidden script, written beside it for the runs, removed afterwards."""
    converted = NotebookScript.read(path)
    atomic_write_text(converted.script_path, converted.script)
    try:
        yield converted
    finally:
        with contextlib.suppress(OSError):
            os.unlink(converted.script_path)


def show_cells(report: Report, converted: NotebookScript, shown: str) -> None:
    """Findings and edits of the report point at cells, not at the hidden script."""
    for finding in report.findings:
        finding.location = converted.locate(finding.location, shown)
    for edit in report.edits or ():
        start, end = edit.line_range
        first, last = converted.lines.get(start), converted.lines.get(end)
        edit.display_path = f"{shown} (cell {first[0] + 1})" if first else shown
        edit.cell_range = (first[1], last[1] if last and last[0] == first[0] else first[1]) if first else (0, 0)
