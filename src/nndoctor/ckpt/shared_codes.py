"""Findings for catalog codes that runtime checks own too (C101, C103, C104).

The classes live in ``nndoctor/checks/`` as ``scope = "run"`` checks; ckpt builds findings
through them so name, severity and fix stay in one place. Until those classes exist the
fallback metadata below keeps ``nndoctor ckpt`` working; it must agree with the classes
(tests/hostile/test_hostile_ckpt.py checks it). ``ckpt`` raises C104 to an error for a file whose
pickle names anything outside the allowlist: that is code, not a load setting.
"""

from __future__ import annotations

from typing import Any

from nndoctor.findings import Finding, Location, Severity
from nndoctor.registry import get_check

_FALLBACK: dict[str, tuple[str, Severity, str]] = {
    "C101": ("wrapper-prefix-in-checkpoint", Severity.WARNING,
             "save model.module.state_dict() (DataParallel/DDP) or model._orig_mod.state_dict() "
             "(torch.compile), or strip the prefix: nndoctor ckpt fix IN -o OUT"),
    "C103": ("whole-model-pickle", Severity.WARNING,
             "save model.state_dict() instead of the model object; recover one with nndoctor ckpt fix"),
    "C104": ("unsafe-checkpoint-load", Severity.WARNING,
             "load with torch.load(weights_only=True), prefer .safetensors, and only pass "
             "--trust / weights_only=False for files you created yourself"),
}


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
    cls = get_check(code)
    if cls is not None:
        return cls.finding(message, location=location, evidence=evidence, fix=fix, severity=severity)
    name, default_severity, default_fix = _FALLBACK[code]
    return Finding(code=code, name=name, severity=severity or default_severity, message=message,
                   fix=fix or default_fix, location=location, evidence=dict(evidence or {}))
