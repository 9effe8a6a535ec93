"""The stall watchdog: a daemon thread that notices when training stops making progress.

It reads the progress the R104 check records (batches, forwards, backward passes, optimizer
steps). After ``NNDOCTOR_STALL_SECONDS`` (``--stall-seconds``, default 300; 0 disables) without
any, it dumps every thread's stack with the user's frames marked, records where the main
thread is blocked (and in which ``torch.distributed`` collective), reports R104, leaves a
snapshot of this rank's report for the other ranks (X110 compares them), writes the JSON
report, and keeps waiting — or, with ``--stall-action stop``, interrupts the run.
"""

from __future__ import annotations

import argparse
import linecache
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nndoctor.core.findings import Location
from nndoctor.core.stash import StashKey
from nndoctor.core.user_code import display_path, is_tool_file, is_user_code, user_location

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol

DEFAULT_STALL_SECONDS = 300.0
# How long a stopping child of mp.spawn waits for its peers' stall snapshots (bounded: a peer that
# is not stalled never writes one).
PEER_STALL_WAIT_S = 10.0
EXIT_STALLED = 124  # like timeout(1): stopped by --stall-action stop
# How long the interrupted main thread gets to end the run before the process is ended: the
# run's end (report, a garbage collection once TensorFlow is loaded) takes seconds on a loaded
# machine, and ending the process then also ends whatever hosts the run (a notebook, pytest).
# NNDOCTOR_STOP_GRACE sets it (tests of a run stuck in native code, which waits all of it).
STOP_GRACE_S = 10.0
_ENV_SECONDS = "NNDOCTOR_STALL_SECONDS"
_ENV_ACTION = "NNDOCTOR_STALL_ACTION"
_ENV_GRACE = "NNDOCTOR_STOP_GRACE"


@dataclass(frozen=True)
class StallOutput:
    """Where the watchdog writes the report of a stalled run (``nndoctor run``'s output options);
    without them (``watch()``, a child process) it writes and prints nothing."""

    json: str | None = None
    quiet: bool = True


STALL_OUTPUT = StashKey[StallOutput]("stall watchdog output options")


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stall-seconds", type=float, metavar="S",
                        help="report a stall (R104) after S seconds without a batch, forward or "
                             "optimizer step, with every thread's stack (default 300; 0 disables)")
    parser.add_argument("--stall-action", choices=("wait", "stop"),
                        help="after reporting a stall: keep waiting (default) or stop the run")


def configure(session: Any, args: argparse.Namespace) -> None:
    """Apply the options; exported through the environment so ranks and child processes share them."""
    seconds = getattr(args, "stall_seconds", None)
    action = getattr(args, "stall_action", None)
    if seconds is not None:
        os.environ[_ENV_SECONDS] = repr(float(seconds))
    if action is not None:
        os.environ[_ENV_ACTION] = action
    session.stash[STALL_OUTPUT] = StallOutput(json=getattr(args, "json", None),
                                              quiet=bool(getattr(args, "quiet", False)))


def stall_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get(_ENV_SECONDS, DEFAULT_STALL_SECONDS)))
    except ValueError:
        return DEFAULT_STALL_SECONDS


def stop_grace_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get(_ENV_GRACE, STOP_GRACE_S)))
    except ValueError:
        return STOP_GRACE_S


def stall_action() -> str:
    return "stop" if os.environ.get(_ENV_ACTION) == "stop" else "wait"


# -- stacks ----------------------------------------------------------------------------------
def format_stack(frame: Any) -> tuple[str, list[str]]:
    """The stack, outermost first, user frames marked ``>>`` with their source line; and the
    user frames as ``path:line``."""
    user: list[str] = []
    out: list[str] = []
    for depth, (f, lineno) in enumerate(reversed(list(traceback.walk_stack(frame)))):
        if is_tool_file(f.f_code.co_filename) or (depth == 0 and f.f_code.co_filename == "<string>"):
            continue  # ours, runpy's, or a spawned child's `python -c` bootstrap
        where = f"{display_path(f.f_code.co_filename)}:{lineno}"
        if is_user_code(f.f_code):
            user.append(where)
            source = linecache.getline(f.f_code.co_filename, lineno).strip()
            out.append(f"  >> {where} in {f.f_code.co_name}" + (f"\n        {source}" if source else ""))
        else:
            out.append(f"     {where} in {f.f_code.co_name}")
    return "\n".join(out), user


def thread_stacks(skip: int | None = None) -> list[dict[str, Any]]:
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    stacks = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        text, user = format_stack(frame)
        stacks.append({"thread": names.get(ident, str(ident)), "main": ident == main,
                       "stack": text, "user_frames": user, "_frame": frame if ident == main else None})
    return sorted(stacks, key=lambda s: not s["main"])


# -- the thread ------------------------------------------------------------------------------
class Watchdog(threading.Thread):
    def __init__(self, session: Any, check: Any) -> None:
        super().__init__(name="nndoctor-stall-watchdog", daemon=True)
        self.session, self.check = session, check
        self.stopped = threading.Event()
        self.fired_at: float | None = None
        # The check counts progress (no clock read on the training thread); this thread notes
        # when the count last moved: a stall is seen at most one poll interval late.
        self._beats = check.beats
        self._moved_at = time.monotonic()

    def run(self) -> None:
        while not self.stopped.is_set():
            seconds = stall_seconds()
            self.stopped.wait(min(1.0, seconds / 4) if seconds else 1.0)
            if self.stopped.is_set() or not seconds or not self.session.active:
                continue
            try:
                self.poll(seconds)
            except Exception as error:  # noqa: BLE001 - observer rule
                self.session.internal_error("stall watchdog", error)

    def poll(self, seconds: float) -> None:
        from nndoctor.instrument.ddp_hooks import collective_state

        collective = collective_state(self.session)
        if not (self.check.armed or collective.name):
            return
        beats = self.check.beats
        if beats != self._beats:
            self._beats, self._moved_at = beats, time.monotonic()
        last = self._moved_at
        if collective.name and not self.check.armed:
            last = collective.since
        idle = time.monotonic() - last
        if idle < seconds:
            self.fired_at = None
            return
        if self.fired_at == last:
            return  # this stall was reported; report again only after progress resumed
        self.fired_at = last
        fire(self.session, self.check, idle, self.ident)


def fire(session: Any, check: Any, idle: float, own_ident: int | None) -> None:
    from nndoctor.instrument.ddp_hooks import collective_state
    from nndoctor.run.distributed.parts import rank_data

    stacks = thread_stacks(skip=own_ident)
    main = next((s for s in stacks if s["main"]), None)
    main_frame = main.pop("_frame") if main else None
    for s in stacks:
        s.pop("_frame", None)
    location = user_location(main_frame) if main_frame is not None else None
    del main_frame
    state = collective_state(session)
    collective, collective_location = state.name, None
    frame = state.frame_ref
    if collective and frame is not None:
        found = user_location(frame)
        collective_location = str(found) if found else None
    del frame
    data = rank_data(session)
    rank = _rank(session)
    record = {
        "rank": rank, "idle_s": round(idle, 1), "step": session.step, "last_progress": check.last_kind,
        "collective": collective, "collective_location": collective_location,
        "location": str(location) if location else None,
        "user_frames": main["user_frames"] if main else [],
    }
    data["stall"] = record
    prefix = f"[rank {rank}] " if rank is not None else ""
    header = (f"\n{prefix}nndoctor: no batch, forward or optimizer step for {idle:.0f} s "
              f"(last: {check.last_kind} at step {session.step}); "
              + (f"blocked in torch.distributed.{collective} at {collective_location}. " if collective else "")
              + "Stacks of every thread (>> marks your code):")
    body = "\n".join(f"{prefix}-- thread {s['thread']}{' (main)' if s['main'] else ''}\n{s['stack']}" for s in stacks)
    print(header + "\n" + body, file=sys.stderr, flush=True)
    blocked = f"in torch.distributed.{collective} called at {collective_location}" if collective else (
        f"at {location}" if location else "outside your code")
    report = (lambda *a, **k: None) if getattr(check, "silent", False) else check.report
    report(
        f"No batch, forward or optimizer step for {idle:.0f} s (last progress: {check.last_kind} "
        f"at step {session.step}): the main thread is blocked {blocked}. Every thread's stack was "
        "printed to stderr (>> marks your frames).",
        location=location if isinstance(location, Location) else None,
        evidence={"idle_s": round(idle, 1), "stall_seconds": stall_seconds(),
                  "last_progress": check.last_kind, "collective": collective,
                  "main_thread_user_frames": record["user_frames"][-6:],
                  "threads": len(stacks), **({"rank": rank} if rank is not None else {})},
        step=session.step,
    )
    session.report.extra["stall_stacks"] = [{"thread": s["thread"], "stack": s["stack"]} for s in stacks]
    _note_flight(session, data)
    stopping = stall_action() == "stop"
    if stopping:
        from nndoctor.run.distributed.stall_merge import STALL_STOPPED

        session.stash[STALL_STOPPED] = True
    snapshot = _share_and_write(session, record)
    if stopping:
        _wait_for_peers(session)
        _stop(session, snapshot)


def _note_flight(session: Any, data: dict[str, Any]) -> None:
    """The flight record (last step, last collective entered) goes into the snapshot: the
    merged report compares the ranks' collectives even when every rank is stopped in native
    code and never writes its final part."""
    from nndoctor.instrument.ddp_hooks import FLIGHT_RECORDER

    recorder = session.stash.get(FLIGHT_RECORDER, None)
    if recorder is not None:
        data["flight"] = recorder.snapshot()


def _wait_for_peers(session: Any) -> None:
    """Before stopping, let the other ranks' watchdogs leave their snapshots: stopping this rank
    first would make their collectives fail instead of showing where they were blocked."""
    from nndoctor.run.distributed.context import torchrun_rank
    from nndoctor.run.distributed.parts import child_part, rank_data, wait_for_stalls

    info = torchrun_rank()
    child = child_part(session)
    world = info.world_size if info is not None else rank_data(session).get("world_size")
    folder: str | None
    if info is not None:
        from nndoctor.run.distributed.context import parts_dir
        from nndoctor.run.distributed.stall_merge import gather_window, wait_for_merge

        if info.is_leader or info.world_size < 2:
            return  # rank 0 gathered the others' snapshots before delivering the merged report
        # Stopping now would make torchrun stop rank 0 before its merged report is out. Rank 0's
        # watchdog may fire a little after this one's, then waits for the snapshots: bounded.
        wait_for_merge(parts_dir(info), 2 * gather_window(stall_seconds()) + 5.0)
        return
    folder = child[0] if child else None
    if folder and world and world > 1:
        # The peers' watchdogs fire when their own last progress is stall_seconds old: ranks
        # that started apart, or a loaded machine, put seconds between them (with a 2 s
        # threshold, twice the threshold was too short once in five loaded test runs).
        wait_for_stalls(folder, int(world), timeout_s=PEER_STALL_WAIT_S)


def _rank(session: Any) -> int | None:
    from nndoctor.run.distributed.context import torchrun_rank
    from nndoctor.run.distributed.parts import child_part, rank_data

    info = torchrun_rank()
    if info is not None:
        return info.rank
    rank: int | None = rank_data(session).get("rank")
    if rank is None:
        child = child_part(session)
        rank = child[1] if child else None
    return rank


def _share_and_write(session: Any, record: dict[str, Any]) -> Any:
    """Leave this rank's snapshot for the others; rank 0 (or a lone process) writes the JSON."""
    import dataclasses

    from nndoctor.run.distributed.context import torchrun_rank
    from nndoctor.run.distributed.parts import child_part, rank_data, write_part

    output = session.stash.get(STALL_OUTPUT, StallOutput())
    info = torchrun_rank()
    child = child_part(session)
    snapshot = dataclasses.replace(session.report, status="stalled", steps=session.step,
                                   findings=list(session.report.findings))
    if child is not None:
        write_part(child[0], int(rank_data(session).get("rank", child[1])), rank_data(session).get("world_size"),
                   snapshot, rank_data(session), unique=True, stall=True)
        return None
    if info is not None:
        from nndoctor.run.distributed.context import parts_dir
        from nndoctor.run.distributed.stall_merge import STALL_MERGED, mark_merged, merge_stalled

        folder = parts_dir(info)
        write_part(folder, info.rank, info.world_size, snapshot, rank_data(session), stall=True)
        if not info.is_leader:
            return None
        try:
            snapshot = merge_stalled(session, info, folder, snapshot, stall_seconds())
        except Exception as error:  # noqa: BLE001 - observer rule: this rank's snapshot then
            session.internal_error("merging the stalled ranks' reports", error)
        if stall_action() == "stop":
            _deliver(snapshot, output)
            session.stash[STALL_MERGED] = True
            mark_merged(folder)
            return None  # delivered: nothing more to print on the way out
    if output.json:
        from nndoctor.report import write_json

        try:
            write_json(snapshot, output.json)
        except OSError as error:
            print(f"nndoctor: could not write {output.json}: {error}", file=sys.stderr)
    if not output.quiet and stall_action() != "stop":  # stop: the final report follows
        from nndoctor.report import print_report

        print_report(snapshot, sys.stderr)
    return snapshot


def _deliver(report: Any, output: StallOutput) -> None:
    from nndoctor.report import print_report, write_json

    if output.json:
        try:
            write_json(report, output.json)
        except OSError as error:
            print(f"nndoctor: could not write {output.json}: {error}", file=sys.stderr)
    if not output.quiet:
        print_report(report, sys.stderr, json_path=output.json if output.json != "-" else None)


def _stop(session: Any, snapshot: Any) -> None:
    """Interrupt the main thread; if it is stuck in native code, or SIGINT cannot reach it,
    end the process."""
    import signal

    # SIGINT reaches the main thread as KeyboardInterrupt only when Python handles it: a shell
    # without job control starts background commands (`cmd &` in a script, CI steps) with it
    # ignored, and Python leaves it ignored (https://docs.python.org/3/library/signal.html#note-
    # on-signal-handlers-and-exceptions); SIG_DFL would kill the process before any report.
    handler = signal.getsignal(signal.SIGINT)
    interruptible = callable(handler)
    if interruptible:
        main = threading.main_thread().ident
        try:  # a real signal also interrupts a blocking wait (lock, sleep, queue)
            if main is None:  # never for a running main thread; the fallback below then
                raise ValueError("main thread not started")
            signal.pthread_kill(main, signal.SIGINT)
        except (AttributeError, OSError, ValueError):
            import _thread

            _thread.interrupt_main()
        deadline = time.monotonic() + stop_grace_seconds()
        while session.active and time.monotonic() < deadline:
            time.sleep(0.1)
    if session.active:
        from nndoctor.run.distributed.parts import child_part

        if child_part(session) is not None:
            time.sleep(2.0)  # let sibling ranks leave their snapshots before the parent reacts
        why = ("the run is stuck in native code" if interruptible else
               f"SIGINT is {'ignored' if handler == signal.SIG_IGN else 'not handled by Python'} "
               "in this process (a background job of a shell without job control ignores it), "
               "so the main thread cannot be interrupted")
        print(f"nndoctor: {why}; stopping it (--stall-action stop)", file=sys.stderr, flush=True)
        output = session.stash.get(STALL_OUTPUT, StallOutput())
        if snapshot is not None and not output.quiet:
            from nndoctor.report import print_report

            print_report(snapshot, sys.stderr, json_path=output.json if output.json != "-" else None)
        os._exit(EXIT_STALLED)


def install(installation: InstallationProtocol) -> None:
    from nndoctor.checks.stall import CollectiveMismatch, TrainingStalled

    session = installation.session
    check = next((c for c in session.checks if isinstance(c, TrainingStalled)), None)
    if check is None:
        if not any(isinstance(c, CollectiveMismatch) for c in session.checks):
            return
        # X110 alone still needs the watchdog (and its progress notes), not R104's finding.
        session._add_check(TrainingStalled)
        check = next((c for c in session.checks if isinstance(c, TrainingStalled)), None)
        if check is None:
            return
        check.silent = True
    watchdog = Watchdog(session, check)
    watchdog.start()
    installation.patcher.on_undo(watchdog.stopped.set)
