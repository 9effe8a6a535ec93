"""Closing a run: explain a crash, let the checks conclude, remove every hook and patch.

Every way a session ends goes through ``finish``: a script run (``runner``), a child process
(``distributed.children``), ``nndoctor.watch()`` and the framework integrations.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

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
    with _late_stop_signal_absorbed(session):
        _conclude(session, installation, status, crash)


def _conclude(session: Session, installation: InstallationProtocol, status: str, crash: BaseException | None) -> None:
    report = session.report
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


@contextlib.contextmanager
def _late_stop_signal_absorbed(session: Session) -> Iterator[None]:
    """While a run the stall watchdog stopped (``--stall-action stop``) is being closed, its
    SIGINT is absorbed. The watchdog interrupts a main thread blocked in native code (a gloo or
    NCCL collective); Python runs the handler only once that call returns, and when the call
    returns with its own error (the peer rank was stopped too), the KeyboardInterrupt surfaces
    wherever the closing code happens to be: it used to cut a rank's report short and show as an
    internal error of nndoctor's ("finish: KeyboardInterrupt"). A SIGINT of the user's own
    (no stop under way) still interrupts as before."""
    from nndoctor.run.distributed.stall_merge import STALL_STOPPED

    stopped = session.stash.get(STALL_STOPPED, False)
    if not stopped or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: Any = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, _absorb)
    except (ValueError, OSError):  # not settable here: close as before
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(ValueError, OSError, TypeError):
            signal.signal(signal.SIGINT, previous)


def _absorb(signum: int, frame: Any) -> None:
    """The stall watchdog's SIGINT, arriving after the run already ended: nothing left to stop."""


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
