"""Closing a run: explain a crash, let the checks conclude, remove every hook and patch.

Every way a session ends goes through ``finish``: a script run (``runner``), a child process
(``distributed.children``), ``nndoctor.watch()`` and the framework integrations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nndoctor.core import events as ev
from nndoctor.core.engine import Session
from nndoctor.core.tracebacks import full_traceback, user_traceback
from nndoctor.run.crash_context import CRASH_CONTEXT, crash_context

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol


def finish(session: Session, installation: InstallationProtocol, status: str, crash: BaseException | None) -> None:
    """Close a run: explain a crash, let checks conclude, remove every hook and patch."""
    report = session.report
    report.status = status
    try:
        if crash is not None:
            report.traceback = user_traceback(crash)
            report.extra["traceback"] = report.traceback
            report.extra["traceback_full"] = full_traceback(crash)  # nndoctor's frames too
            record = crash_context(session)
            context = dict(record.context) if record is not None else {}
            session.emit(ev.Crash(step=session.step, exception=crash, context=context))
            explain_crash(session, crash)
        session.emit(ev.RunEnd(step=session.step, status=status, wall_s=session.elapsed()))
    except BaseException as error:  # noqa: BLE001 - observer rule
        session.internal_error("finish", error)
    finally:
        installation.uninstall()
        report.steps = session.step
        budget = session.sample_budget
        if budget is not None and budget.changes:
            report.extra["sampling"] = budget.summary()
        # The crash context describes this run's end only; drop it with the hooks.
        if CRASH_CONTEXT in session.stash:
            del session.stash[CRASH_CONTEXT]


def explain_crash(session: Session, error: BaseException) -> None:
    """Add the crash explanation finding(s), if the explain package is there."""
    try:
        from nndoctor.commands.explain import runtime
    except ModuleNotFoundError:
        return
    try:
        for finding in runtime.explain_crash(error, session):
            session.add_finding(finding)
    except Exception as failure:  # noqa: BLE001 - the user's traceback is still shown
        session.internal_error("crash explanation", failure)
