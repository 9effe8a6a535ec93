"""Findings and reports: the plain data every nndoctor command produces and every reporter reads."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1


class Severity(enum.IntEnum):
    """How bad a finding is. Ordered so that ``ERROR > WARNING > INFO``."""

    INFO = 1
    WARNING = 2
    ERROR = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (use error, warning or info)") from None


@dataclass(frozen=True)
class Location:
    """A place in the user's code (or a file on disk, for data/ckpt findings)."""

    path: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line is not None else self.path

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line}


@dataclass
class Finding:
    """One diagnosed problem.

    ``count`` and ``first_step`` let repeated occurrences of the same problem at the same
    place merge into one line of the report instead of flooding it.
    """

    code: str
    name: str
    severity: Severity
    message: str
    fix: str
    location: Location | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    count: int = 1
    first_step: int | None = None
    # The ranks of a distributed run on which it occurred (None outside distributed runs).
    ranks: list[int] | None = None

    @property
    def merge_key(self) -> tuple[str, Location | None]:
        return (self.code, self.location)

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.label,
            "message": self.message,
            "location": self.location.to_json() if self.location else None,
            "count": self.count,
            "first_step": self.first_step,
            "evidence": _jsonable(self.evidence),
            "fix": self.fix,
            **({"ranks": list(self.ranks)} if self.ranks is not None else {}),
        }


@dataclass
class InternalError:
    """A failure inside nndoctor itself: reported, never raised into the user's run."""

    where: str
    error: str
    traceback: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"where": self.where, "error": self.error, "traceback": self.traceback}


@dataclass
class Suppressed:
    """A finding left out of the report by a suppression comment or the configuration."""

    finding: Finding
    reason: str  # e.g. "comment at train.py:12" or "per-file-ignores 'tests/*' in pyproject.toml"

    def to_json(self) -> dict[str, Any]:
        return {**self.finding.to_json(), "reason": self.reason}


STATUSES = ("completed", "stopped", "crashed", "interrupted", "terminated")


@dataclass
class Report:
    """Findings plus what is known about the run (or scan) that produced them."""

    command: list[str] = field(default_factory=list)
    status: str = "completed"
    steps: int = 0
    findings: list[Finding] = field(default_factory=list)
    internal_errors: list[InternalError] = field(default_factory=list)
    exit_code: int | None = None
    traceback: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # A merged distributed run: {"world_size": N, "ranks": [per-rank detail]} (top level in JSON).
    distributed: dict[str, Any] | None = None
    suppressed: list[Suppressed] = field(default_factory=list)
    # ``nndoctor fix``: the edits proposed for the findings (nndoctor.commands.fix.edit.Edit); None
    # for every other command (no "edits" key in their JSON).
    edits: list[Any] | None = None
    # What the doctor saw over the steps (nndoctor.run.history.RunHistory), for the HTML and
    # TensorBoard reports; None when not recorded. Not part of the JSON schema.
    history: Any = field(default=None, repr=False, compare=False)

    def add(self, finding: Finding) -> Finding:
        """Add a finding, merging it into an earlier one with the same code and place."""
        for existing in self.findings:
            if existing.merge_key == finding.merge_key:
                existing.count += finding.count
                if existing.first_step is None:
                    existing.first_step = finding.first_step
                # The worst occurrence decides how the merged finding reads.
                if finding.severity > existing.severity:
                    existing.severity = finding.severity
                    existing.message = finding.message
                    existing.evidence = finding.evidence
                return existing
        self.findings.append(finding)
        return finding

    def sorted_findings(self) -> list[Finding]:
        """Most important first: crash explanations, then by severity, then by first step."""
        def key(f: Finding) -> tuple[int, int, int, str]:
            crash_first = 0 if f.code.startswith("E") else 1
            step = f.first_step if f.first_step is not None else 1 << 30
            return (crash_first, -int(f.severity), step, f.code)

        return sorted(self.findings, key=key)

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def by_code(self, code: str) -> list[Finding]:
        return [f for f in self.findings if f.code == code]

    def reaches(self, fail_on: Severity | None) -> bool:
        """True when some finding is at least as severe as ``fail_on`` (None: never fail)."""
        worst = self.worst()
        return fail_on is not None and worst is not None and worst >= fail_on

    def to_json(self, tool_version: str) -> dict[str, Any]:
        data: dict[str, Any] = {
            "tool": "nndoctor",
            "version": tool_version,
            "schema": SCHEMA_VERSION,
            "command": list(self.command),
            "status": self.status,
            "steps": self.steps,
            "findings": [f.to_json() for f in self.sorted_findings()],
            "internal_errors": [e.to_json() for e in self.internal_errors],
            "suppressed": [s.to_json() for s in self.suppressed],
        }
        if self.exit_code is not None:
            data["exit_code"] = self.exit_code
        if self.extra:
            data["extra"] = _jsonable(self.extra)
        if self.distributed is not None:
            data.update(_jsonable(self.distributed))
        if self.edits is not None:
            data["edits"] = [e.to_json() for e in self.edits]
        return data


def _jsonable(value: Any) -> Any:
    """Turn evidence into JSON-safe values without importing numpy or torch."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Location):
        return value.to_json()
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return _jsonable(item())
        except Exception:  # noqa: BLE001 - a user object's item() may raise anything: fall back to tolist/str
            pass
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        try:
            return _jsonable(tolist())
        except Exception:  # noqa: BLE001 - a user object's tolist() may raise anything: fall back to str
            pass
    return str(value)
