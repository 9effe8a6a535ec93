"""``--verify``: re-run the patched script; keep an edit only when it removed its finding and
brought no new error or warning, and the script still trains.

First all edits are tried together (one run). When that run shows a problem, each remaining
edit is tried alone, and the ones that pass alone are tried together once more.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from nndoctor.commands.fix.edit import APPLIED, ROLLED_BACK, VERIFIED, Edit, Hunk, map_line
from nndoctor.commands.fix.files import patched, write_source
from nndoctor.core.findings import Finding, Report, Severity

Rerun = Callable[[], Report]


def _file(finding: Finding) -> str | None:
    if finding.location is None or not finding.location.path:
        return None
    return os.path.realpath(os.path.abspath(finding.location.path))


class Check:
    """Compares a re-run with the first run for a set of applied edits."""

    def __init__(self, baseline: Report, applied: list[Edit]) -> None:
        self.baseline = baseline
        self.hunks: dict[str, list[Hunk]] = {}
        for edit in applied:
            self.hunks.setdefault(os.path.realpath(edit.path), []).extend(edit.hunks)

    def moved(self, finding: Finding) -> tuple[str | None, int | None]:
        path = _file(finding)
        line = finding.location.line if finding.location else None
        if path is not None and line is not None:
            line = map_line(line, self.hunks.get(path, []))
        return path, line

    def still_there(self, edit: Edit, rerun: Report) -> Finding | None:
        places = {self.moved(f) for f in edit.findings}
        path = os.path.realpath(edit.path)
        shift = 0
        for hunk in sorted(self.hunks.get(path, []), key=lambda h: h.start):
            if hunk in edit.hunks:
                start = hunk.start + shift
                places |= {(path, line) for line in range(start, start + max(1, len(hunk.new_lines)))}
            shift += hunk.delta
        for finding in rerun.by_code(edit.code):
            if (_file(finding), finding.location.line if finding.location else None) in places:
                return finding
        return None

    def new_problems(self, rerun: Report) -> list[Finding]:
        before = {(f.code, *self.moved(f)) for f in self.baseline.findings}
        return [f for f in rerun.findings if f.severity >= Severity.WARNING
                and (f.code, _file(f), f.location.line if f.location else None) not in before]

    def broken(self, rerun: Report) -> str | None:
        ok = ("completed", "stopped")
        if self.baseline.status in ok and rerun.status not in ok:
            return f"the script now ends {rerun.status}" + (f": {rerun.traceback.strip().splitlines()[-1]}"
                                                           if rerun.traceback else "")
        if self.baseline.steps > 0 and rerun.steps == 0:
            return "the script no longer takes an optimizer step"
        if self.baseline.exit_code in (None, 0) and rerun.exit_code not in (None, 0):
            return f"the script now exits with status {rerun.exit_code}"
        return None

    def verdicts(self, edits: list[Edit], rerun: Report) -> dict[int, str | None]:
        """id(edit) -> None when it passed, else why not."""
        broken = self.broken(rerun)
        new = self.new_problems(rerun)
        result: dict[int, str | None] = {}
        for edit in edits:
            left = self.still_there(edit, rerun)
            if left is not None:
                result[id(edit)] = f"{edit.code} is still reported at line {left.location.line if left.location else '?'}"
            elif broken:
                result[id(edit)] = broken
            elif new:
                first = new[0]
                result[id(edit)] = (f"{first.code} ({first.severity.label}) appeared at "
                                    f"{first.location or 'an unknown place'}: {first.message}")
            else:
                result[id(edit)] = None
        return result


def _write(originals: dict[str, str], edits: list[Edit]) -> None:
    for path, original in originals.items():
        write_source(path, patched(original, [e for e in edits if e.path == path]))


def verify(edits: list[Edit], originals: dict[str, str], baseline: Report, rerun: Rerun) -> Report:
    """Mark each edit VERIFIED or ROLLED_BACK; the files end with only the verified edits.
    Returns the last re-run's report (the state the files are left in)."""
    pending = [e for e in edits if e.status == APPLIED]
    _write(originals, pending)
    report = rerun()
    verdicts = Check(baseline, pending).verdicts(pending, report)
    if all(v is None for v in verdicts.values()):
        for edit in pending:
            edit.status = VERIFIED
        return report
    # Something went wrong: judge each edit on its own.
    passed: list[Edit] = []
    for edit in pending:
        _write(originals, [edit])
        alone = rerun()
        why = Check(baseline, [edit]).verdicts([edit], alone)[id(edit)]
        if why is None:
            passed.append(edit)
        else:
            edit.status, edit.reason = ROLLED_BACK, f"rolled back: {why}"
    _write(originals, passed)
    if not passed:
        return rerun()
    report = rerun()
    together = Check(baseline, passed).verdicts(passed, report)
    if any(v is not None for v in together.values()):
        why = next(v for v in together.values() if v is not None)
        for edit in passed:
            edit.status, edit.reason = ROLLED_BACK, f"rolled back: each edit passes alone, but together {why}"
        _write(originals, [])
        return rerun()
    for edit in passed:
        edit.status = VERIFIED
    return report
