"""Explaining a live crash at the end of ``nndoctor run`` / ``nndoctor.watch()``.

``nndoctor.runner.finish`` calls ``explain_crash(error, session)`` once, after the user's
script raised. The runner catches anything raised here and still shows the user's original
traceback; failures while gathering live evidence are reported as internal errors and the
explanation falls back to what the message alone says.
"""

from __future__ import annotations

from typing import Any

from nndoctor.explain.base import explain
from nndoctor.explain.crash import Crash, from_exception
from nndoctor.findings import Finding

_MAX_CHAIN = 4


def exception_chain(error: BaseException) -> list[BaseException]:
    """The raised exception first, then its causes/contexts (a wrapper's original error)."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and len(chain) < _MAX_CHAIN and all(current is not e for e in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _context_for(error: BaseException, session: Any) -> dict[str, Any]:
    """The engine's crash context, only if it was recorded for this very exception (a context
    left by an exception the user caught earlier would describe the wrong module)."""
    ref = getattr(session, "crash_exception", None)
    recorded = ref() if callable(ref) else None
    if recorded is not None and recorded is error:
        return dict(getattr(session, "crash_context", {}) or {})
    return {}


def explain_crash(error: BaseException, session: Any) -> list[Finding]:
    """The explanation finding for ``error`` (empty when the cause is unknown)."""
    select = list(getattr(session, "select", ()) or ())
    ignore = list(getattr(session, "ignore", ()) or ())
    failures: list[tuple[str, BaseException]] = []
    first: Crash | None = None
    finding = None
    for candidate in exception_chain(error):
        crash = from_exception(candidate, context=_context_for(candidate, session), session=session)
        first = first or crash
        finding = explain(crash, select=select, ignore=ignore, failures=failures)
        if finding is not None:
            break
    for where, failure in failures:
        session.internal_error(where, failure)
    report = getattr(session, "report", None)
    if report is not None and first is not None:
        report.extra["crash"] = {
            "type": first.exc_type,
            "message": first.message.splitlines()[0] if first.message else "",
            "location": str(first.location) if first.location else None,
            "explained_by": finding.code if finding else None,
        }
    return [finding] if finding is not None else []
