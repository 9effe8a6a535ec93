"""Findings for catalog codes that runtime checks own (C101, C103, C104).

The classes live in ``nndoctor/checks/`` as ``scope = "run"`` checks; ckpt builds their
findings from the catalog table, so name, severity and fix stay the checks' own without
importing the runtime checks (and PyTorch). ``ckpt`` raises C104 to an error for a file whose
pickle names anything outside the allowlist: that is code, not a load setting.
"""

from __future__ import annotations

from typing import Any

from nndoctor.catalog.table import rule
from nndoctor.core.findings import Finding, Location, Severity


def shared_finding(
    code: str,
    message: str,
    *,
    path: str | None = None,
    evidence: dict[str, Any] | None = None,
    fix: str | None = None,
    severity: Severity | None = None,
) -> Finding:
    location = Location(path) if path else None
    return rule(code).finding(message, location=location, evidence=evidence, fix=fix, severity=severity)
