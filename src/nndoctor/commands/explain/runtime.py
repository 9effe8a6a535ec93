"""Explaining a live crash at the end of ``nndoctor run`` / ``nndoctor.watch()``.

``nndoctor.run.end.finish`` calls ``explain_crash(error, session)`` once, after the user's
script raised. The runner catches anything raised here and still shows the user's original
traceback; failures while gathering live evidence are reported as internal errors and the
explanation falls back to what the message alone says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nndoctor.commands.explain.base import explain
from nndoctor.commands.explain.crash import Crash, from_exception
from nndoctor.commands.explain.evidence import module_context_from_traceback
from nndoctor.core.findings import Finding
from nndoctor.run.crash_context import crash_context

if TYPE_CHECKING:
    from nndoctor.core.engine import Session

_MAX_CHAIN = 4


def exception_chain(error: BaseException) -> list[BaseException]:
    """The raised exception first, then its causes/contexts (a wrapper's original error)."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and len(chain) < _MAX_CHAIN and all(current is not e for e in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _engine_context(error: BaseException, session: Session) -> dict[str, Any]:
    """The engine's crash context, only if it was recorded for this very exception (a context
    left by an exception the user caught earlier would describe the wrong module)."""
    record = crash_context(session)
    return record.for_exception(error) if record is not None else {}


def live_crash(error: BaseException, session: Session) -> Crash:
    """A ``Crash`` for ``error`` with the module context read from its own traceback (exact
    for this exception), completed by the engine's context (the step) when it matches."""
    engine = _engine_context(error, session)
    crash = from_exception(error, context=engine, session=session)
    found = module_context_from_traceback(error)
    if found is not None:
        context, crash.module_ref, crash.root_ref = found
        context.setdefault("step", engine.get("step", session.step))
        crash.context = context
    return crash


def explain_crash(error: BaseException, session: Session) -> list[Finding]:
    """The explanation finding for ``error`` (empty when the cause is unknown)."""
    select, ignore = list(session.select), list(session.ignore)
    failures: list[tuple[str, BaseException]] = []
    first: Crash | None = None
    finding = None
    for candidate in exception_chain(error):
        crash = live_crash(candidate, session)
        first = first or crash
        finding = explain(crash, select=select, ignore=ignore, failures=failures)
        if finding is not None:
            break
    for where, failure in failures:
        session.internal_error(where, failure)
    if first is not None:
        session.report.extra["crash"] = {
            "type": first.exc_type,
            "message": first.message.splitlines()[0] if first.message else "",
            "location": str(first.location) if first.location else None,
            "source": first.user_frame.source if first.user_frame else "",
            "explained_by": finding.code if finding else None,
        }
    return [finding] if finding is not None else []
