"""Processes the script starts itself (``torch.multiprocessing.spawn``, ``multiprocessing.Process``)
are instrumented too, and report back to the parent.

``Process.start`` is wrapped: the child's target (for ``mp.spawn``, the function it calls
with the process index) is replaced by a picklable ``ChildEntry`` that runs it under its own
session, with the parent's check selection, and writes the child's report part into a folder
the parent reads when its own run ends. DataLoader workers and other library processes are
left alone. A target that cannot be pickled fails exactly as it would without nndoctor
(``ChildEntry`` pickles the target itself).
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import tempfile
import weakref
from typing import TYPE_CHECKING, Any

from nndoctor.run.distributed.parts import (
    CHILD_PART,
    rank_data,
    read_parts,
    remove_parts,
    write_part,
)

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol

# Modules whose processes are not trainers (DataLoader workers, pools, managers, ourselves).
_LIBRARY_PREFIXES = ("torch.", "multiprocessing.", "concurrent.", "nndoctor.", "joblib.", "loky.")

# The installation of this process (to drop, in a forked child, the one inherited from the parent).
_CURRENT: dict[str, Any] = {}


class ChildEntry:
    """The target of an instrumented child process: runs ``fn`` under a fresh session."""

    def __init__(self, fn: Any, config: dict[str, Any], index: int) -> None:
        self.fn, self.config, self.index = fn, config, index

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return run_child(self.fn, args, kwargs, self.config, self.index)


def run_child(fn: Any, args: tuple, kwargs: dict, config: dict[str, Any], index: int) -> Any:
    from nndoctor.core.engine import Session, StopRun
    from nndoctor.instrument.torch_hooks import install
    from nndoctor.run.end import finish

    inherited = _CURRENT.get("installation")
    if inherited is not None and inherited.session.pid != os.getpid():
        inherited.uninstall()  # forked: the parent's hooks would only see a foreign session
    session = Session(select=config["select"], ignore=config["ignore"], command=config["command"],
                      max_steps=config.get("max_steps"), full_window=config["full_window"],
                      sample_every=config["sample_every"], sample_budget=config.get("sample_budget", 0.0))
    session.stash[CHILD_PART] = (config["folder"], index)  # for the stall watchdog
    # The parent's features (functions, pickled by reference for a spawned child): importing
    # instrument.extensions here would make this module import itself through that list.
    installation = install(session, config["features"])
    status, crash, result = "completed", None, None
    try:
        result = fn(*args, **kwargs)
    except StopRun:
        status = "stopped"
    except SystemExit as exit_:
        code = exit_.code
        session.report.exit_code = code if isinstance(code, int) else (0 if code is None else 1)
        raise
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except BaseException as error:
        status, crash = "crashed", error
        raise
    finally:
        finish(session, installation, status, crash)
        session.report.steps = session.step
        data = rank_data(session)
        try:
            write_part(config["folder"], int(data.get("rank", index)), data.get("world_size"),
                       session.report, data, unique=True)
        except OSError as error:
            print(f"nndoctor: child process could not write its report part: {error}", file=sys.stderr)
    return result


def _is_library_target(target: Any) -> bool:
    module = getattr(target, "__module__", None) or ""
    return module == "multiprocessing" or module.startswith(_LIBRARY_PREFIXES)


def install(installation: InstallationProtocol) -> None:
    import multiprocessing.process as mp_process

    session = installation.session
    owner_pid = os.getpid()
    state: dict[str, Any] = {"folder": None}
    started: list[weakref.ref] = []
    counter = itertools.count()
    _CURRENT["installation"] = installation

    def config() -> dict[str, Any]:
        if state["folder"] is None:
            state["folder"] = tempfile.mkdtemp(prefix="nndoctor-children-")
        return {
            "folder": state["folder"], "select": list(session.select), "ignore": list(session.ignore),
            "command": list(session.report.command), "max_steps": session.max_steps,
            "full_window": session.full_window, "sample_every": session.sample_every,
            "sample_budget": session.sample_budget.budget if session.sample_budget is not None else 0.0,
            "features": installation.features,
        }

    original_start = mp_process.BaseProcess.start

    @functools.wraps(original_start)
    def start(process):
        wrapped = False
        if session.active and os.getpid() == owner_pid:
            try:
                wrapped = _wrap_target(process, config, counter)
            except Exception as error:  # noqa: BLE001 - observer rule: start it unobserved
                session.internal_error("child process instrumentation", error)
        result = original_start(process)
        if wrapped:
            # By weak reference: its exit status names the signal of a child that died
            # without Python (it then wrote no part).
            started.append(weakref.ref(process))
        return result

    installation.patcher.patch(mp_process.BaseProcess, "start", start)
    launched = _watch_subprocesses(installation, owner_pid)

    def collect() -> None:
        if os.getpid() != owner_pid:
            return
        if state["folder"] is None:
            _note_unobserved(session, launched)
            return
        from nndoctor.run.distributed.dead_ranks import dead_children
        from nndoctor.run.distributed.merge import attach_children
        parts = read_parts(state["folder"])
        processes = [p for p in (ref() for ref in started) if p is not None]
        exitcodes = {p.pid: p.exitcode for p in processes if p.pid is not None}
        parts += dead_children(state["folder"], parts, exitcodes)
        attach_children(session.report, parts, list(session.select), list(session.ignore))
        remove_parts(state["folder"])
        # The report's headline counts the steps the children trained.
        session.step = max([session.step] + [int(p["report"].get("steps", 0)) for p in parts])

    def forget() -> None:
        if _CURRENT.get("installation") is installation:
            del _CURRENT["installation"]

    installation.patcher.on_undo(forget)
    installation.patcher.on_undo(collect)


def _watch_subprocesses(installation: InstallationProtocol, owner_pid: int) -> list[str]:
    """Remember the Python programs the script starts with ``subprocess`` (a launcher's ranks):
    they run outside the session, so a run that trained nothing itself must not look clean."""
    import subprocess

    launched: list[str] = []
    original_init = subprocess.Popen.__init__

    @functools.wraps(original_init)
    def popen_init(popen, args, *rest, **kwargs):
        try:
            if os.getpid() == owner_pid and len(launched) < 8:
                argv = [str(a) for a in ([args] if isinstance(args, (str, bytes, os.PathLike)) else list(args))]
                program = os.path.basename(argv[0].split()[0]) if argv and argv[0] else ""
                if program.startswith(("python", "torchrun", "accelerate", "deepspeed")):
                    launched.append(" ".join(argv)[:200])
        except Exception:  # noqa: BLE001 - observer rule: never break the user's subprocess
            pass
        return original_init(popen, args, *rest, **kwargs)

    installation.patcher.patch(subprocess.Popen, "__init__", popen_init)
    return launched


def _note_unobserved(session: Any, launched: list[str]) -> None:
    if not launched or session.step or list(session.state.roots):
        return
    session.report.extra["not_observed"] = (
        f"Nothing was observed: the script trained nothing itself and started {len(launched)} Python "
        f"process(es) that nndoctor did not instrument (e.g. `{launched[0]}`). Run nndoctor inside "
        "them, e.g. torchrun --nproc_per_node N -m nndoctor run train.py."
    )


def _wrap_target(process: Any, config: Any, counter: Any) -> bool:
    """Instrument the child's target; True when it is (or already was) ours."""
    target = getattr(process, "_target", None)
    if target is None:
        return False
    if isinstance(target, ChildEntry):
        return True
    spawn_module = sys.modules.get("torch.multiprocessing.spawn")
    if spawn_module is not None and target is getattr(spawn_module, "_wrap", None):
        fn, index, *rest = process._args
        if not isinstance(fn, ChildEntry):
            process._args = (ChildEntry(fn, config(), int(index)), index, *rest)
        return True
    if _is_library_target(target):
        return False
    process._target = ChildEntry(target, config(), next(counter))
    return True
