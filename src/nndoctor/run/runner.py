"""Running the user's unchanged script (or module) under a session, like ``python`` would.

The script sees the argv it was given, ``__name__ == "__main__"``, its own folder first on
``sys.path`` and the caller's working directory; its ``sys.exit`` code is kept. Every
outcome — completed, stopped by ``--max-steps``, crashed, interrupted — ends with a report.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nndoctor.core.engine import Session, StopRun
from nndoctor.core.findings import Report
from nndoctor.run.end import finish
from nndoctor.run.guards import ProcessState, ThreadStops
from nndoctor.util.errors import UsageError

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol


def release_stopped_pipelines() -> None:
    """Collect the frames a stopped run left in reference cycles, while Python is still whole.

    A ``tf.data`` iterator stopped mid-epoch (``fit`` stopped by ``--max-steps``) whose ``map``
    runs a ``tf.numpy_function``/``py_function`` otherwise outlives the script: at interpreter
    exit TensorFlow's worker threads wait for the GIL of a finalizing interpreter and the process
    hangs (measured on a from_tensor_slices → map(numpy_function) → batch pipeline stopped at
    step 10: it never exited; with this collection it exits at once). The collection must run
    once the ``StopRun`` exception is gone: inside its handler the traceback's frames still hold
    the iterators (tests/fixtures/tfdata/keras_tf_backend_fit.py, shuffle + numpy_function map,
    hung at exit that way; tests/tfdata/test_stopped_pipeline_exit.py)."""
    if "tensorflow" in sys.modules:
        import gc

        gc.collect()


@dataclass
class Target:
    """What to run: a script path or a module name, with its arguments."""

    name: str
    args: list[str]
    is_module: bool = False

    @property
    def command(self) -> list[str]:
        return (["-m", self.name] if self.is_module else [self.name]) + list(self.args)


def check_target(target: Target) -> None:
    """Refuse clearly what Python would refuse, before instrumenting anything."""
    if target.is_module:
        import importlib.util

        try:
            spec = importlib.util.find_spec(target.name)
        except (ImportError, ValueError) as error:
            raise UsageError(f"cannot find module {target.name!r}: {error}") from None
        if spec is None:
            raise UsageError(f"no module named {target.name!r}")
        return
    if not os.path.exists(target.name):
        raise UsageError(f"can't open file {target.name!r}: no such file")
    if os.path.isdir(target.name) and not os.path.exists(os.path.join(target.name, "__main__.py")):
        raise UsageError(f"{target.name!r} is a directory without __main__.py")
    if not os.path.isdir(target.name):
        try:
            with open(target.name, "rb") as handle:
                source = handle.read()
            compile(source, target.name, "exec")
        except SyntaxError as error:
            where = f"{error.filename}:{error.lineno}" if error.lineno else target.name
            raise UsageError(f"syntax error in {where}: {error.msg}") from None
        except (OSError, ValueError) as error:
            raise UsageError(f"can't read {target.name!r}: {error}") from None


def run_target(target: Target, session: Session, *,
               deliver: Callable[[Report], None] | None = None,
               handoff: dict[int, Callable[[int, Any], None]] | None = None) -> Report:
    """Run ``target`` under ``session`` and return the finished report.

    With ``deliver`` (the CLI's way of writing the JSON and printing the report), SIGTERM and
    ``os._exit`` during the run also end with a delivered report (``nndoctor.run.signals``);
    ``handoff`` gives signals the handler that takes over from the guard when the script ends.
    """
    from nndoctor.instrument.extensions import install

    report = session.report
    report.command = target.command
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    if target.is_module:
        sys.argv = [target.name, *target.args]
        path0 = os.getcwd()
    else:
        sys.argv = [target.name, *target.args]
        path0 = os.path.dirname(os.path.abspath(target.name))
    if sys.path:
        sys.path[0] = path0
    else:
        sys.path.insert(0, path0)
    try:
        check_target(target)
    except UsageError:
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
        raise

    installation = install(session)
    status, crash = "completed", None
    guard = _abrupt_end_guard(session, installation, deliver, handoff)
    process_state, thread_stops = ProcessState(), ThreadStops()
    try:
        with guard, thread_stops:
            if target.is_module:
                runpy.run_module(target.name, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target.name, run_name="__main__")
    except StopRun:
        status = "stopped"
    except SystemExit as exit_:
        code = exit_.code
        if code is None or code == 0:
            report.exit_code = 0
        elif isinstance(code, int):
            report.exit_code = code
        else:
            with contextlib.suppress(Exception):
                print(code, file=sys.stderr)
            report.exit_code = 1
    except KeyboardInterrupt as interrupt:
        status, crash = "interrupted", None
        process_state.uncaught = interrupt
    except BaseException as error:  # noqa: BLE001 - the user's crash, reported below
        status, crash = "crashed", error
        process_state.uncaught = error
    finally:
        if status == "completed" and thread_stops.seen:
            status = "stopped"  # --max-steps reached in a training thread
        finish(session, installation, status, crash)
        process_state.call_users_excepthook()
        process_state.restore()
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
    if status != "completed":
        # Only now, with no exception and no traceback of the run left: their frames hold the
        # stopped pipeline's iterators, which a collection inside the handler cannot free.
        crash = process_state.uncaught = None
        release_stopped_pipelines()
    return report


def _abrupt_end_guard(session: Session, installation: InstallationProtocol, deliver: Callable[[Report], None] | None,
                      handoff: dict[int, Callable[[int, Any], None]] | None = None,
                      ) -> contextlib.AbstractContextManager:
    if deliver is None:
        return contextlib.nullcontext()
    from nndoctor.run.signals import AbruptEndGuard

    def end_run(status: str, exit_code: int | None) -> None:
        if exit_code is not None:
            session.report.exit_code = exit_code
        finish(session, installation, status, None)
        deliver(session.report)

    return AbruptEndGuard(session, end_run, handoff)
