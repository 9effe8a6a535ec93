"""Start the ranks of in-process ``mp.spawn`` fixtures from a warm fork server (tests only).

A fixture that calls ``torch.multiprocessing.spawn`` starts each rank as a fresh interpreter,
and each pays torch's import (~2 CPU-s) and torch._dynamo's (~1.8 CPU-s: the optimizer's
``zero_grad`` imports it on first call) before its few milliseconds of training. Twenty-odd
fixtures run that way in the suite, on a 2-core machine whose suite is CPU-bound.

In the test process, ``start_method="spawn"`` of torch's ``start_processes`` becomes
``"forkserver"`` with torch, torch._dynamo and nndoctor's child-side modules preloaded: each rank
is forked from a server that already imported them. What a rank does is otherwise what a
spawned rank does: ``multiprocessing.spawn.prepare`` gives it the parent's ``sys.path``, working
directory and ``__main__`` (re-imported as ``__mp_main__``, as spawn does), and nndoctor's
``Process.start`` wrapper hands it the same ``ChildEntry``. One difference is closed here: a fork
server's children inherit the *server's* environment, taken when it started, while a spawned
child inherits the parent's at spawn time (fixtures and tests set ``NNDOCTOR_*`` variables just
before spawning); the parent's environment travels with the preparation data and replaces the
child's before its target runs.

The real spawn path stays covered: ``cold()`` gives torch's own start method back for a test
(tests/distributed/test_children.py runs an ``mp.spawn`` fixture so), ``multiprocessing``'s own
spawn context is untouched, and torchrun's ranks are fresh interpreters.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.spawn as mp_spawn
import os
import sys
from collections.abc import Iterator
from typing import Any

_PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.distributed",
    "torch.nn.parallel",
    "tests.warm_spawn",  # installs carry_environment() in the server, so in every child
    "nndoctor.core.engine",
    "nndoctor.instrument.torch_hooks",
    "nndoctor.run.distributed.children",
    "nndoctor.run.end",
]
_ENVIRONMENT = "nndoctor_test_environ"


def install() -> None:
    """Route torch's spawn start method through the warm fork server, in this process."""
    torch_spawn = sys.modules.get("torch.multiprocessing.spawn")
    if torch_spawn is None or getattr(torch_spawn.start_processes, "_warm", False):
        return
    multiprocessing.set_forkserver_preload(_PRELOAD)
    start_processes = torch_spawn.start_processes

    def start_processes_warm(fn: Any, args: tuple = (), nprocs: int = 1, join: bool = True,
                             daemon: bool = False, start_method: str = "spawn") -> Any:
        if start_method == "spawn":
            start_method = "forkserver"
        return start_processes(fn, args, nprocs, join, daemon, start_method)

    start_processes_warm._warm = True  # type: ignore[attr-defined]
    start_processes_warm._cold = start_processes  # type: ignore[attr-defined]
    torch_spawn.start_processes = start_processes_warm
    _send_environment()


@contextlib.contextmanager
def cold() -> Iterator[None]:
    """torch's own spawn start method for the duration (a fresh interpreter per rank)."""
    torch_spawn = sys.modules.get("torch.multiprocessing.spawn")
    warm = getattr(torch_spawn, "start_processes", None)
    if warm is None or not getattr(warm, "_warm", False):
        yield
        return
    torch_spawn.start_processes = warm._cold  # type: ignore[union-attr]
    try:
        yield
    finally:
        torch_spawn.start_processes = warm  # type: ignore[union-attr]


def _send_environment() -> None:
    get_preparation_data = mp_spawn.get_preparation_data

    def with_environment(name: str) -> dict[str, Any]:
        data = get_preparation_data(name)
        data[_ENVIRONMENT] = dict(os.environ)
        return data

    mp_spawn.get_preparation_data = with_environment


def carry_environment() -> None:
    """In the fork server: a child takes the parent's environment from its preparation data."""
    prepare = mp_spawn.prepare
    if getattr(prepare, "_warm", False):
        return

    def prepare_with_environment(data: dict[str, Any]) -> None:
        environment = data.pop(_ENVIRONMENT, None)
        if environment is not None:
            os.environ.clear()
            os.environ.update(environment)
        prepare(data)

    prepare_with_environment._warm = True  # type: ignore[attr-defined]
    mp_spawn.prepare = prepare_with_environment


# Imported by the fork server (preload) and by the test process: ``prepare`` only runs in a child
# that is starting, so patching it in the test process changes nothing there.
carry_environment()
