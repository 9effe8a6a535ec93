"""R103: TensorBoard logs that never reach the disk — a ``SummaryWriter`` that received nothing,
or one whose queued events die with a child process that ends through ``os._exit``."""

from __future__ import annotations

import multiprocessing
import os
import sys
from types import FrameType

from nndoctor.events import RunEnd
from nndoctor.findings import Severity
from nndoctor.instrument.tensorboard_probe import WriterRecord, writer_log
from nndoctor.registry import Check, register


def never_written(records: list[WriterRecord]) -> list[WriterRecord]:
    """Writers that received no ``add_*`` call in the whole run."""
    return [r for r in records if r.adds == 0]


def lost_at_child_exit(records: list[WriterRecord], in_child: bool) -> list[WriterRecord]:
    """Writers with ``add_*`` calls after their last flush/close, in a process that ends through
    ``os._exit`` (a forked multiprocessing child: no atexit, no buffered file flushed)."""
    if not in_child:
        return []
    return [r for r in records if r.adds_since_flush > 0]


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
    ``add_*`` calls, its ``flush()`` and ``close()`` calls. At the end of the run it reports

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
    ``SummaryWriter`` queues events (``max_queue=10``) and writes them to a buffered file that
    it flushes every ``flush_secs=120`` seconds or on ``flush()``/``close()``. A process that
    ends without flushing loses everything logged since the last flush — a short child-process
    run loses all of it — and TensorBoard shows a run with no data, with no error anywhere.
    A writer that is created but never written to looks exactly the same, so the user cannot
    tell a logging bug from a lost file.

    ## Example
    ```python
    def train(rank, world_size):
        writer = SummaryWriter(f"runs/rank{rank}")
        for step in range(steps):
            ...
            writer.add_scalar("loss", loss.item(), step)
        # a forked child ends here through os._exit: the queued events are dropped

    torch.multiprocessing.start_processes(train, args=(2,), nprocs=2, start_method="fork")
    ```

    ## Use instead
    Close the writer when training ends (``writer.close()``, or ``with SummaryWriter(...) as
    writer:``), and call ``writer.flush()`` at checkpoints of long runs; in the main process
    closing is good hygiene too, in a forked child process it is required. Make sure the logging
    condition can be met within the run's length (log at step 0, or every N steps with N
    smaller than the number of steps).

    ## References
    - PyTorch docs, ``torch.utils.tensorboard.writer.SummaryWriter`` (``max_queue``, ``flush_secs``, ``flush()``, ``close()``): https://pytorch.org/docs/stable/tensorboard.html
    - Python docs, ``os._exit`` ("Exit the process ... without calling cleanup handlers, flushing stdio buffers, etc."): https://docs.python.org/3/library/os.html#os._exit
    - Python docs, ``multiprocessing`` start methods (spawn, fork, forkserver; the default changes in 3.14): https://docs.python.org/3/library/multiprocessing.html#contexts-and-start-methods
    - Python docs, ``atexit`` (handlers are not called when the program is killed by a signal or ``os._exit()`` is called): https://docs.python.org/3/library/atexit.html
    """

    code = "R103"
    name = "tensorboard-not-flushed"
    severity = Severity.WARNING
    summary = "a SummaryWriter never written to, or not flushed/closed before a forked child process exits"
    fix = "call writer.close() (or use `with SummaryWriter(...) as writer:`) when training ends"
    needs = frozenset({"tensorboard_writers"})

    def on_run_end(self, event: RunEnd) -> None:
        log = writer_log(self.session)
        if log is None:
            return
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
