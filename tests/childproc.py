"""Child processes in tests: timeouts scaled to the machine, and a timeout that says what the child
was doing.

A test that starts ``nndoctor run`` (or a TensorFlow runner) and waits for it has to bound the
wait, but a fixed bound is wrong twice: too short on a loaded 2-core machine (the test fails for
no bug), and silent when it expires (``TimeoutExpired`` says only that time ran out). Here:

- ``scaled(seconds)``: a bound multiplied by how much slower this machine is *now* than the quiet
  2-core VM the bounds were written on (a fixed pure-Python workload timed once per process,
  times the load average per core when it is above one);
- children get ``PYTHONFAULTHANDLER=1``; when a wait expires, the child is sent SIGABRT, so its
  faulthandler prints every thread's Python stack, and the test fails with that stack, the
  child's state and its output so far.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

# Seconds the workload below takes on the quiet 2-core VM (Xeon, Python 3.11), best of 3.
_REFERENCE_S = 0.045


def _workload() -> float:
    started = time.perf_counter()
    total = 0
    for i in range(400_000):
        total += i * i % 7
    return time.perf_counter() - started


@functools.lru_cache(maxsize=1)
def slowdown() -> float:
    """How many times slower than the reference machine this one runs now (at least 1)."""
    cpu = min(_workload() for _ in range(3)) / _REFERENCE_S
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = 1.0
    # Either measure can miss the other's cause (a short workload may get a whole core on a busy
    # machine; a slow CPU shows no load). Capped: past 4× a bound hides hangs more than it helps.
    return min(4.0, max(1.0, cpu, load))


def scaled(seconds: float) -> float:
    """A timeout of ``seconds`` on the reference machine, for this machine as loaded now."""
    return seconds * slowdown()


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: the given one (default: ours) with Python's faulthandler on."""
    return dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")


class ChildTimedOut(AssertionError):
    """A child process outlived its bound; the message holds what it was doing."""


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        return f"{fields.get('State', '?').strip()}, {fields.get('Threads', '?').strip()} threads"
    except OSError:
        return "unknown (no /proc)"


def explain_timeout(process: subprocess.Popen, waited: float, args: Any) -> ChildTimedOut:
    """Abort the still-running ``process`` so it prints its threads' stacks; the error to raise."""
    state = _state(process.pid)
    try:
        process.send_signal(signal.SIGABRT)  # faulthandler (PYTHONFAULTHANDLER=1) dumps the stacks
        out, err = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    def text(data: Any) -> str:
        if isinstance(data, bytes):
            return data.decode(errors="replace")
        return data or ""
    return ChildTimedOut(
        f"child still running after {waited:.0f} s (timeouts scaled ×{slowdown():.1f} for this "
        f"machine): {args}\nits state then: {state}\n--- its stderr (with the stacks of its "
        f"threads when it is Python) ---\n{text(err)[-6000:]}\n--- its stdout ---\n{text(out)[-2000:]}")


def communicate(process: subprocess.Popen, timeout: float) -> tuple[Any, Any]:
    """``process.communicate`` bounded by ``scaled(timeout)``; on expiry, explain and fail."""
    bound = scaled(timeout)
    try:
        return process.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        raise explain_timeout(process, bound, process.args) from None


def run(args: Sequence[str] | str, *, timeout: float, env: dict[str, str] | None = None,
        capture_output: bool = True, text: bool = True, input: Any = None,
        **popen_kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` with a scaled timeout that says what the child was doing."""
    if capture_output:
        popen_kwargs.setdefault("stdout", subprocess.PIPE)
        popen_kwargs.setdefault("stderr", subprocess.PIPE)
    if input is not None:
        popen_kwargs["stdin"] = subprocess.PIPE
    with subprocess.Popen(args, env=child_env(env), text=text, **popen_kwargs) as process:
        bound = scaled(timeout)
        try:
            out, err = process.communicate(input=input, timeout=bound)
        except subprocess.TimeoutExpired:
            raise explain_timeout(process, bound, args) from None
    return subprocess.CompletedProcess(args, process.returncode, out, err)
