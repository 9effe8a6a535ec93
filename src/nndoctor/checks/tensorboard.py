"""R103: TensorBoard logs that the user will not see as logged — a ``SummaryWriter`` that received
nothing, one whose queued events die with a child process that ends through ``os._exit``, and
one that logs the same tag over the same steps as another run in its log directory."""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from nndoctor.checks.tensorboard_files import steps_by_tag
from nndoctor.core.events import RunEnd
from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register
from nndoctor.instrument.tensorboard_probe import WriterRecord, writer_log


def never_written(records: list[WriterRecord]) -> list[WriterRecord]:
    """Writers that received no ``add_*`` call in the whole run."""
    return [r for r in records if r.adds == 0]


def lost_at_child_exit(records: list[WriterRecord], in_child: bool) -> list[WriterRecord]:
    """Writers with ``add_*`` calls after their last flush/close, in a process that ends through
    ``os._exit`` (a forked multiprocessing child: no atexit, no buffered file flushed)."""
    if not in_child:
        return []
    return [r for r in records if r.adds_since_flush > 0]


@dataclass
class MixedRun:
    """A writer whose steps overlap another run's in the same log directory."""

    record: WriterRecord
    other: str  # "event file NAME (written before this run)" or "the SummaryWriter created at FILE:LINE"
    tag: str
    other_steps: tuple[int, int]
    own_steps: tuple[int, int]
    sharing: int  # event files of other runs in the directory


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _first_overlap(own: dict[str, tuple[int, int]], other: dict[str, tuple[int, int]]) -> str | None:
    return next((tag for tag, steps in own.items() if tag in other and _overlap(steps, other[tag])), None)


def mixed_runs(records: list[WriterRecord],
               read_steps: Callable[[str], dict[str, tuple[int, int]]] = steps_by_tag) -> list[MixedRun]:
    """Writers (in creation order) that log a tag over steps another run already logged in the
    same directory: an event file that was there before the run, or an earlier writer of this
    run. A writer given ``purge_step`` (TensorBoard then drops the older events from that step
    on) and logs that continue after the earlier ones (a resumed run) are not reported."""
    found: list[MixedRun] = []
    by_dir: dict[str, list[WriterRecord]] = {}
    for record in records:
        if record.log_dir is None:
            continue
        directory = os.path.realpath(record.log_dir)
        earlier_writers = by_dir.setdefault(directory, [])
        if record.steps and record.purge_step is None:
            this_run = {f for writer in earlier_writers for f in writer.own_files}
            before = [f for f in record.earlier_files if f not in this_run]
            overlap = None
            for path in before:
                other = read_steps(path)
                tag = _first_overlap(record.steps, other)
                if tag is not None:
                    overlap = MixedRun(record, f"event file {os.path.basename(path)} (written before this run)",
                                       tag, other[tag], record.steps[tag], 0)
                    break
            for writer in earlier_writers if overlap is None else []:
                tag = _first_overlap(record.steps, writer.steps)
                if tag is not None:
                    where = (f"{os.path.basename(writer.created_at.path)}:{writer.created_at.line}"
                             if writer.created_at is not None else "an earlier line")
                    overlap = MixedRun(record, f"the SummaryWriter created at {where}", tag,
                                       writer.steps[tag], record.steps[tag], 0)
                    break
            if overlap is not None:
                overlap.sharing = len(before) + len(earlier_writers)
                found.append(overlap)
        earlier_writers.append(record)
    return found


# The multiprocessing modules whose children end through os._exit: a forked child returns from
# Popen._launch (fork) or the fork server's loop (forkserver) and calls os._exit there; a spawned
# child returns to spawn_main, which calls sys.exit, so the interpreter exits normally.
_OS_EXIT_LAUNCHERS = ("popen_fork.py", "forkserver.py")


def launched_by_fork(frame: FrameType | None) -> bool:
    """Whether ``frame``'s stack runs inside a fork / forkserver launcher of ``multiprocessing``."""
    while frame is not None:
        path = frame.f_code.co_filename
        if os.path.basename(path) in _OS_EXIT_LAUNCHERS and os.path.basename(os.path.dirname(path)) == "multiprocessing":
            return True
        frame = frame.f_back
    return False


def ends_through_os_exit() -> bool:
    """This process is a multiprocessing child started by fork or forkserver (checked on the
    stack of the thread that ends the run: the child's main thread)."""
    return multiprocessing.parent_process() is not None and launched_by_fork(sys._getframe(1))


@register
class TensorBoardNotFlushed(Check):
    """
    ## What it does
    Follows every ``torch.utils.tensorboard.SummaryWriter`` the script creates (its methods are
    wrapped once the script imports ``torch.utils.tensorboard``): the line that created it, its
    log directory and the event files already in it, the ``global_step`` range of each tag it
    logs, its ``flush()`` and ``close()`` calls. At the end of the run it reports what
    TensorBoard will show wrongly:

    - **runs mixed in one directory**: the writer logs a tag over steps that another run already
      logged in the same log directory — an event file that was there before this run (the
      script was re-run with the same ``log_dir``), or another writer of this run (a sweep that
      creates ``SummaryWriter("runs/sweep")`` per configuration). TensorBoard treats a directory
      as one run and merges its event files, so the two curves are drawn as one line that jumps
      back and forth. Not reported: a writer given ``purge_step`` (TensorBoard drops the older
      events from that step on) and a resumed run whose steps continue after the earlier ones;
    - a writer that received **no** ``add_*`` call at all: the logging line was never reached
      (``if step % 1000 == 0`` in a run of 300 steps, a crash or ``--max-steps`` before the first
      log), so TensorBoard shows an empty run;
    - in a child process started by ``fork`` or ``forkserver`` (``multiprocessing.Process`` with
      Linux's default start method before Python 3.14, ``torch.multiprocessing.start_processes(...,
      start_method="fork")``), a writer with ``add_*`` calls after its last ``flush()``/``close()``.
      Such children end through ``os._exit``, which skips ``atexit`` handlers and flushes no
      buffered file: the events still queued are lost. Spawned children (``mp.spawn``'s
      default) end through ``sys.exit`` and keep their events, so they are not reported.

    A writer in the main process that is never closed is **not** reported: on a normal
    interpreter exit its events reach the disk. Measured with TensorBoard's
    ``EventFileLoader`` on a writer that logged 20 scalars and was neither flushed nor closed:
    main process, normal exit 20/20 events on disk, ``os._exit(0)`` 0/20, ``SIGKILL`` 0/20;
    in a child of ``torch.multiprocessing.start_processes``: ``spawn`` 20/20, ``fork`` 0/20,
    ``forkserver`` 0/20, and 20/20 with each start method once the child calls ``close()``.

    ## Why is this bad?
    TensorBoard reads every event file of a log directory as one run, ordered by time, and
    plots the steps it finds: two runs that both logged ``train/loss`` at steps 1–30 become a
    single curve that zigzags between them, and nothing says that two runs are mixed.
    ``SummaryWriter`` queues events (``max_queue=10``) and writes them to a buffered file that
    it flushes every ``flush_secs=120`` seconds or on ``flush()``/``close()``. A process that
    ends without flushing loses everything logged since the last flush — a short child-process
    run loses all of it — and TensorBoard shows a run with no data, with no error anywhere.
    A writer that is created but never written to looks exactly the same, so the user cannot
    tell a logging bug from a lost file.

    ## Example
    ```python
    for lr in (0.1, 0.01):
        writer = SummaryWriter("runs/sweep")  # both configurations write into one directory
        for step in range(steps):
            ...
            writer.add_scalar("train/loss", loss.item(), step)
        writer.close()

    def train(rank, world_size):
        writer = SummaryWriter(f"runs/rank{rank}")
        for step in range(steps):
            ...
            writer.add_scalar("loss", loss.item(), step)
        # a forked child ends here through os._exit: the queued events are dropped

    torch.multiprocessing.start_processes(train, args=(2,), nprocs=2, start_method="fork")
    ```

    ## Use instead
    Give each run its own log directory (``SummaryWriter(f"runs/sweep/lr{lr}")``, or
    ``SummaryWriter()``, which picks ``runs/DATE_HOST``); when resuming into the same directory,
    continue the step count where the run stopped, or pass ``purge_step`` so TensorBoard drops
    the events logged after the checkpoint. Close the writer when training ends
    (``writer.close()``, or ``with SummaryWriter(...) as writer:``), and call ``writer.flush()``
    at checkpoints of long runs; in a forked child process closing is required. Make sure the
    logging condition can be met within the run's length (log at step 0, or every N steps with
    N smaller than the number of steps).

    ## References
    - PyTorch docs, ``torch.utils.tensorboard.writer.SummaryWriter`` (``log_dir``: "Use hierarchical folder structure to compare between runs easily. e.g. pass in 'runs/exp1', 'runs/exp2'"; ``purge_step``; ``max_queue``, ``flush_secs``, ``flush()``, ``close()``): https://pytorch.org/docs/stable/tensorboard.html
    - TensorFlow issue #9512, maintainer's answer: TensorBoard "doesn't like it when you write multiple event files from separate runs in the same directory ... use a new subdirectory for every run": https://github.com/tensorflow/tensorflow/issues/9512
    - TensorBoard issue #179: "the data from all event files in a directory is, roughly speaking, concatenated as if there were only one file": https://github.com/tensorflow/tensorboard/issues/179
    - TensorBoard issue #1011: two writers appending to one run directory — TensorBoard follows the newest file and stops reading the other: https://github.com/tensorflow/tensorboard/issues/1011
    - tensorboard_logger issue #21: a loss curve going backwards along the step axis, caused by several runs' event files in one directory: https://github.com/TeamHG-Memex/tensorboard_logger/issues/21
    - Python docs, ``os._exit`` ("Exit the process ... without calling cleanup handlers, flushing stdio buffers, etc."): https://docs.python.org/3/library/os.html#os._exit
    - Python docs, ``multiprocessing`` start methods (spawn, fork, forkserver; the default changes in 3.14): https://docs.python.org/3/library/multiprocessing.html#contexts-and-start-methods
    - Python docs, ``atexit`` (handlers are not called when the program is killed by a signal or ``os._exit()`` is called): https://docs.python.org/3/library/atexit.html
    """

    code = "R103"
    name = "tensorboard-logs-lost-or-mixed"
    severity = Severity.WARNING
    summary = ("TensorBoard will show a wrong run: a SummaryWriter logging over another run's steps in the same "
               "log directory, never written to, or not flushed before a forked child process exits")
    fix = "give each run its own log directory, and call writer.close() when training ends"
    needs = frozenset({"tensorboard_writers"})

    def on_run_end(self, event: RunEnd) -> None:
        log = writer_log(self.session)
        if log is None:
            return
        for mixed in mixed_runs(log.records):
            first, last = mixed.own_steps
            other_first, other_last = mixed.other_steps
            self.report(
                f"This SummaryWriter logs '{mixed.tag}' at steps {first}–{last} into {mixed.record.log_dir}, where "
                f"{mixed.other} already has '{mixed.tag}' at steps {other_first}–{other_last}: TensorBoard reads "
                f"every event file of a directory as one run, so both are drawn as one curve that jumps between "
                f"them.",
                location=mixed.record.created_at or event.location,
                evidence={"problem": "runs_share_log_dir", "log_dir": mixed.record.log_dir, "tag": mixed.tag,
                          "steps": [first, last], "other": mixed.other, "other_steps": [other_first, other_last],
                          "other_runs_in_dir": mixed.sharing},
                fix="give each run its own log directory (e.g. SummaryWriter(f\"runs/{name}\"), or SummaryWriter() "
                    "for runs/DATE_HOST); to resume into this one, continue the steps or pass purge_step",
                step=event.step,
            )
        for record in never_written(log.records):
            self.report(
                f"This SummaryWriter received no add_* call in the whole run ({event.step} optimizer steps, "
                f"run {event.status}): the logging line was never reached, so TensorBoard shows an empty run.",
                location=record.created_at or event.location,
                evidence={"problem": "never_written", "add_calls": 0, "optimizer_steps": event.step,
                          "run_status": event.status, "flushes": record.flushes, "closes": record.closes},
                fix="make the logging condition reachable within the run (log at step 0, or every N steps with "
                    "N below the run's length)",
                step=event.step,
            )
        for record in lost_at_child_exit(log.records, ends_through_os_exit()):
            self.report(
                f"This SummaryWriter in a forked child process received {record.adds_since_flush} add_* calls after its "
                f"last flush()/close() ({record.adds} in all, {record.flushes} flushes, {record.closes} closes): "
                "fork/forkserver children of multiprocessing end through os._exit, which flushes nothing, so "
                "these events are lost.",
                location=record.created_at or event.location,
                evidence={"problem": "unflushed_in_child", "add_calls": record.adds,
                          "unflushed_add_calls": record.adds_since_flush, "flushes": record.flushes,
                          "closes": record.closes},
                step=event.step,
            )
