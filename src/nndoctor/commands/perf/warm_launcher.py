"""Re-runs forked from a warm process: each ``--try`` re-run starts without importing torch again.

A perf run re-runs the user's script 10–30 times (the baseline and every change, repeated), and a
fresh Python pays the torch import each time: 1–5 s, more than the measured window of a small
model. This launcher starts one helper process that imports torch and the re-run child once, then
forks a copy of itself per re-run. The fork runs exactly what ``python -m nndoctor.commands.perf.torch.rerun_child``
would (same arguments, working directory, environment, stdin from /dev/null, stdout and stderr
into the log) and exits with its status.

Fork safety: the helper never starts a thread, never initialises CUDA and never runs user code,
so each fork starts from the state of a fresh interpreter that has imported torch (and
torch._dynamo, which torch.optim imports at a script's first optimizer anyway). The helper is
started once per (child module, Python path) and reused by later re-runs in the same process;
whatever prevents it (no ``os.fork``, a failed start, ``NNDOCTOR_TRY_WARM=0``) falls back to a
fresh ``python -m`` per re-run, which gives the same results, only slower.

Protocol (one JSON object a line): the parent writes a request ``{"argv", "cwd", "env", "log"}``;
the helper answers ``{"pid": N}`` when the fork started and ``{"returncode": R}`` when it ended
(``-signal`` when a signal killed it, like ``subprocess``).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import Any

# Only children whose imports are fork-safe are forked (TensorFlow starts threads at import).
WARM_CHILDREN = frozenset({"nndoctor.commands.perf.torch.rerun_child"})
_START_TIMEOUT_S = 300.0

_launchers: dict[tuple[str, str], WarmLauncher] = {}
_launchers_lock = threading.Lock()


class LauncherFailed(RuntimeError):
    """The warm helper could not start or stopped answering: re-run in a fresh process."""


class WarmLauncher:
    """One helper process that forks re-runs of ``child`` (a module with ``main(argv) -> int``)."""

    def __init__(self, child: str, env: dict[str, str]) -> None:
        self.child = child
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, child], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=env, close_fds=True)
        self._lock = threading.Lock()
        if self._read(_START_TIMEOUT_S).get("ready") is not True:
            self.close()
            raise LauncherFailed(f"the warm helper for {child} did not start")

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self._process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                raise TimeoutError
        line = self._process.stdout.readline()
        if not line:
            raise LauncherFailed("the warm helper exited")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def run(self, argv: list[str], cwd: str, log: str, timeout: float, env: dict[str, str] | None = None) -> int:
        """Run the child with ``argv`` in a fork; its return code (``subprocess.TimeoutExpired``
        after ``timeout`` seconds, the fork killed; on Ctrl-C / SIGTERM here the fork is killed
        and the helper closed before the interruption goes on)."""
        request = {"argv": argv, "cwd": cwd, "env": dict(os.environ) if env is None else env, "log": log}
        with self._lock:
            assert self._process.stdin is not None
            try:
                self._process.stdin.write(json.dumps(request) + "\n")
                self._process.stdin.flush()
                pid = int(self._read(60.0)["pid"])
            except (OSError, TimeoutError, ValueError, KeyError) as error:
                self.close()
                raise LauncherFailed(f"the warm helper did not fork: {error}") from error
            started = time.monotonic()
            try:
                return int(self._read(timeout)["returncode"])
            except TimeoutError:
                _kill(pid)
                try:  # the helper reaps the killed fork and answers
                    self._read(30.0)
                except (TimeoutError, LauncherFailed):
                    self.close()
                raise subprocess.TimeoutExpired(argv, time.monotonic() - started) from None
            except (ValueError, KeyError) as error:
                self.close()
                raise LauncherFailed(f"the warm helper answered nonsense: {error}") from error
            except BaseException:  # KeyboardInterrupt (SIGTERM in perf): no re-run outlives us
                _kill(pid)
                self._process.kill()
                self._process.wait()
                self.close()
                raise

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                assert self._process.stdin is not None
                self._process.stdin.close()
                self._process.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        for key, launcher in list(_launchers.items()):
            if launcher is self:
                del _launchers[key]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def enabled(child: str) -> bool:
    return (child in WARM_CHILDREN and hasattr(os, "fork")
            and os.environ.get("NNDOCTOR_TRY_WARM", "1") not in ("0", "false", "no"))


def launcher_for(child: str) -> WarmLauncher:
    """The running helper for ``child`` and this Python path, started on first use."""
    key = (child, os.environ.get("PYTHONPATH", ""))
    with _launchers_lock:
        launcher = _launchers.get(key)
        if launcher is None or launcher._process.poll() is not None:
            launcher = _launchers[key] = WarmLauncher(child, dict(os.environ))
    return launcher


@atexit.register
def close_all() -> None:
    for launcher in list(_launchers.values()):
        launcher.close()


# -- the helper process --------------------------------------------------------------------------
def _reply(channel: Any, **message: Any) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def _run_forked(module: Any, request: dict[str, Any]) -> None:
    """In the fork: become ``python -m CHILD ARGV`` in the request's context, then exit."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - fd 0 is /dev/null now
        sys.argv = [module.__file__, *request["argv"]]
        code = int(module.main(request["argv"]) or 0)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001 - the fork reports it in its log, as python would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()  # as an interpreter exit would (os._exit skips them)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(child: str) -> None:
    channel = os.fdopen(os.dup(1), "w")
    # The forks' stdout is their log; nothing else of ours writes to the reply channel.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    import torch  # noqa: F401 - the import every fork would otherwise pay

    # So is torch._dynamo: torch.optim imports it when a script builds its first optimizer (the
    # optimizer's methods are wrapped by torch._disable_dynamo), 1.4-2 s of CPU per re-run of
    # a 2-core machine. Its import starts no thread and queries no CUDA device
    # (torch.cuda.is_initialized() stays False), so the forks inherit it as they inherit torch.
    # It also puts triton before any TensorFlow a script imports: the order that works.
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # noqa: BLE001 - a torch without a working dynamo: the re-run imports what it can
        pass

    module = importlib.import_module(child)
    _reply(channel, ready=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_forked(module, request)
        _reply(channel, pid=pid)
        _, status = os.waitpid(pid, 0)
        _reply(channel, returncode=os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    serve(sys.argv[1])
