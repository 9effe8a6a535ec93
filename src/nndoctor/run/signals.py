"""Abrupt endings still leave a report: SIGTERM, SIGHUP and ``os._exit`` during ``nndoctor run``.

``timeout``, Slurm and Kubernetes stop a job with SIGTERM, and a closed terminal or SSH session
sends SIGHUP; their default action kills Python without unwinding, so no ``finally`` of ours
would run; ``os._exit(n)`` skips them too. While a script runs under the CLI, this guard

- handles those signals: it closes the run with status ``terminated``, delivers the report,
  then dies of the same signal exactly as the default action would (the parent sees "killed by
  signal 15", a shell reports 143);
- stays out of the script's way: ``signal.signal`` / ``signal.getsignal`` for those signals are
  virtualised, so a script that installs its own handler gets it called (and sees the
  handler that was there before nndoctor, not ours), one that restores ``SIG_DFL`` gets the
  default ending (with a report), and ``SIG_IGN`` (``nohup``) is honoured;
- wraps ``os._exit`` in the process that owns the run (not in forked DataLoader workers):
  the report is delivered first, then the process exits with the script's code.

SIGKILL is the one ending without a report that a Python program can do anything about (a
crash of the interpreter itself, SIGSEGV or ``os.abort()``, runs no Python code either). Report
delivery runs in a helper thread with a deadline, so a lock held by the interrupted code can
delay the ending but never hang it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from nndoctor.core.engine import Session
from nndoctor.core.user_code import is_tool_file

# Signals whose default action ends the process and that jobs are routinely stopped with.
ENDING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
# Upper bound on closing the run and writing the report before the process ends anyway.
DELIVERY_DEADLINE_S = float(os.environ.get("NNDOCTOR_ABRUPT_END_DEADLINE", "20"))

# end_run(status, exit_code): close the session and deliver the report (JSON and terminal).
EndRun = Callable[[str, "int | None"], None]

# The guard of the run in progress, for the fork hook below (one run at a time per process).
_active: AbruptEndGuard | None = None
_fork_hook_registered = False


def _leave_forked_child() -> None:
    """A forked child (DataLoader worker, multiprocessing) owns no report: it gets the plain
    signal API, ``os._exit`` and the SIGTERM handler the script set (default: SIG_DFL) back,
    exactly as it would inherit them without nndoctor."""
    global _active
    guard, _active = _active, None
    if guard is not None:
        guard._leave_child()


class AbruptEndGuard:
    """Install around a script run; undo everything on exit (usable as a context manager)."""

    def __init__(self, session: Session, end_run: EndRun,
                 handoff: dict[int, Callable[[int, Any], None]] | None = None) -> None:
        # signal -> the handler that takes over when the run ends, where nndoctor's process had
        # the default one (a torchrun rank notes SIGTERM while it writes its part and merges).
        self._handoff = dict(handoff or {})
        self._session = session
        self._end_run = end_run
        self._pid = os.getpid()
        self._ended = threading.Event()
        self._delivery: threading.Thread | None = None
        self._installed = False
        self._real_signal = signal.signal
        self._real_getsignal = signal.getsignal
        self._real_exit = os._exit
        self._before: dict[int, Any] = {}
        self._virtual: dict[int, Any] = {}  # the handler the script believes is installed

    @property
    def ended(self) -> bool:
        """True once the run was closed here (the caller must not close it again)."""
        return self._ended.is_set()

    # -- install / uninstall -----------------------------------------------------------------
    def __enter__(self) -> AbruptEndGuard:
        global _active, _fork_hook_registered
        if not _fork_hook_registered:
            os.register_at_fork(after_in_child=_leave_forked_child)
            _fork_hook_registered = True
        _active = self
        os._exit = self._os_exit  # type: ignore[assignment]
        if threading.current_thread() is threading.main_thread():
            for signum in ENDING_SIGNALS:
                current = self._real_getsignal(signum)
                if current is signal.SIG_IGN:
                    continue  # nohup: ignored it stays, for the script and the programs it starts
                self._before[signum] = self._virtual[signum] = current
                self._real_signal(signum, self._on_signal)
            signal.signal = self._signal  # type: ignore[assignment]
            signal.getsignal = self._getsignal  # type: ignore[assignment]
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        if _active is self:
            _active = None
        if os._exit == self._os_exit:
            os._exit = self._real_exit  # type: ignore[assignment]
        if not self._installed:
            return
        self._installed = False
        signal.signal, signal.getsignal = self._real_signal, self._real_getsignal  # type: ignore[assignment]
        # nndoctor's own process gets back the handlers it had before the script started.
        for signum, handler in self._before.items():
            if handler in (None, signal.SIG_DFL) and signum in self._handoff:
                handler = self._handoff[signum]
            self._real_signal(signum, handler if handler is not None else signal.SIG_DFL)

    def _leave_child(self) -> None:
        os._exit = self._real_exit  # type: ignore[assignment]
        if not self._installed:
            return
        self._installed = False
        signal.signal, signal.getsignal = self._real_signal, self._real_getsignal  # type: ignore[assignment]
        for signum, handler in self._virtual.items():
            try:
                self._real_signal(signum, handler if handler is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass  # forked from a thread that cannot set handlers; the pid check covers it

    # -- the virtualised signal API ----------------------------------------------------------
    def _signal(self, signalnum: int, handler: Any) -> Any:
        if signalnum not in self._virtual:
            return self._real_signal(signalnum, handler)
        if not (callable(handler) or handler in (signal.SIG_DFL, signal.SIG_IGN)):
            raise TypeError("signal handler must be signal.SIG_IGN, signal.SIG_DFL, or a callable object")
        # Raises ValueError off the main thread, as python does. SIG_IGN is set for real: an
        # ignored signal stays ignored in the programs the script starts (exec keeps SIG_IGN).
        self._real_signal(signalnum, signal.SIG_IGN if handler is signal.SIG_IGN else self._on_signal)
        previous, self._virtual[signalnum] = self._virtual[signalnum], handler
        return previous

    def _getsignal(self, signalnum: int) -> Any:
        if signalnum not in self._virtual:
            return self._real_getsignal(signalnum)
        return self._virtual[signalnum]

    # -- endings -----------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        handler = self._virtual.get(signum)
        if os.getpid() != self._pid and not callable(handler):
            # A forked child (a DataLoader worker stopped with Process.terminate()) inherited this
            # handler: it owns no report and must die exactly as it would without nndoctor.
            self._real_signal(signum, handler if handler is not None else signal.SIG_DFL)
            if handler is not signal.SIG_IGN:
                signal.raise_signal(signum)
            return
        if handler is signal.SIG_IGN:
            return
        name = signal.Signals(signum).name
        if callable(handler):
            self._session.report.extra["signal"] = name
            handler(signum, frame)
            return
        self._session.report.extra["signal"] = name
        self._deliver("terminated", None)
        self._die_of(signum)

    def _os_exit(self, code: int) -> None:
        # nndoctor's own code (a watchdog that already wrote its report) exits as it asked.
        caller = sys._getframe(1).f_code.co_filename
        if os.getpid() == self._pid and not self._ended.is_set() and not is_tool_file(caller):
            self._session.report.extra["ended_by"] = f"os._exit({code})"
            self._deliver("completed", int(code))
        self._real_exit(code)

    def _deliver(self, status: str, exit_code: int | None) -> None:
        """Close the run and write the report, within the deadline, at most once (a second
        ending, say SIGTERM during an ``os._exit`` delivery, waits for the first)."""
        if self._ended.is_set():
            if self._delivery is not None and self._delivery is not threading.current_thread():
                self._delivery.join(DELIVERY_DEADLINE_S)
            return
        self._ended.set()

        def work() -> None:
            try:
                self._end_run(status, exit_code)
            except BaseException as error:  # noqa: BLE001 - we are ending anyway
                try:
                    os.write(2, f"nndoctor: could not write the report: {error}\n".encode())
                except OSError:
                    pass

        worker = threading.Thread(target=work, name="nndoctor-abrupt-end", daemon=True)
        self._delivery = worker
        worker.start()
        worker.join(DELIVERY_DEADLINE_S)

    def _die_of(self, signum: int) -> None:
        self._real_signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
        # The signal blocked by the script (pthread_sigmask): end with the status a shell would show.
        self._real_exit(128 + signum)
