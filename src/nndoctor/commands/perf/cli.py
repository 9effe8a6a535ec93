"""``nndoctor perf [OPTIONS] SCRIPT [ARGS...]``: where the step time goes, and what to change.

Runs the script unchanged for ``--warmup`` + ``--steps`` optimizer steps, stops it cleanly,
prints the step-time breakdown and the P findings; ``--try`` measures changes. Exit
status as ``nndoctor run`` (1 when a finding reaches ``--fail-on``; perf findings are
warnings and advice, so the default ``error`` threshold leaves it at 0).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from nndoctor.cli import add_common_options
from nndoctor.commands.perf.backend import replace_estimates
from nndoctor.commands.perf.classify import order_advice
from nndoctor.commands.perf.config import PerfConfig
from nndoctor.commands.perf.render import breakdown_lines, trial_lines
from nndoctor.commands.perf.schedule import DEFAULT_BUDGET_S
from nndoctor.commands.perf.session import run_perf
from nndoctor.commands.perf.trials import parse_tries
from nndoctor.core.selection import fail_threshold, filter_findings, selectors
from nndoctor.report.delivery import ReportDelivery
from nndoctor.report.outputs import stdout_to_stderr
from nndoctor.report.terminal import print_report
from nndoctor.run.cli import exit_status, target_from_args
from nndoctor.util.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = "nndoctor perf [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]"
    add_common_options(parser)
    parser.add_argument("--steps", type=int, default=20, metavar="N", help="measured optimizer steps (default 20)")
    parser.add_argument("--warmup", type=int, default=None, metavar="N",
                        help=f"optimizer steps run before measuring (default {DEFAULT_WARMUP}; {DDP_WARMUP} under "
                             "torchrun, where the profiled warm-up steps are followed by two unprofiled ones)")
    parser.add_argument("--try", dest="tries", action="append", default=[], metavar="CHANGES",
                        help="measure changes: loader, amp, channels_last, compile, cudnn-benchmark, tf32, "
                             "fused-optimizer, sdpa, cuda-graphs, batch-size (PyTorch); under torchrun with DDP "
                             "ddp-bucket-view, ddp-static-graph, ddp-bucket-cap, ddp-no-sync (ddp: all four); prefetch, "
                             "parallel-map, mixed-precision (Keras/TensorFlow; amp means mixed-precision "
                             "there); all (comma-separated or repeated); step changes re-run your script "
                             "with the change injected")
    parser.add_argument("--try-seconds", type=float, default=2.0, metavar="S",
                        help="seconds timed per --try loader setting and per end-to-end timing of its "
                             "best candidates; a whole epoch is timed instead when it fits in 4×S "
                             "(default 2)")
    parser.add_argument("--try-repeats", type=int, default=3, metavar="N",
                        help="re-runs of the script per step change and for the baseline, interleaved (default 3)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                        help="seconds for the whole run, measured window and --try included (default "
                             f"{DEFAULT_BUDGET_S:g}); a re-run starts only when its estimated cost fits, and every "
                             "change left out is listed with its predicted gain and the command that measures it")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    parser.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS ...]")


DEFAULT_WARMUP = 5
# Under torchrun: 3 profiled steps (all-reduce timeline), then 2 steps for the ranks to settle
# after the profiler stops (unevenly on each rank) before the window, after 2 plain ones.
DDP_WARMUP = 8


def run(args: argparse.Namespace) -> int:
    target = target_from_args(args)
    if args.warmup is None:
        from nndoctor.run.distributed.context import torchrun_rank

        args.warmup = DDP_WARMUP if torchrun_rank() is not None else DEFAULT_WARMUP
    if args.steps < 1 or args.warmup < 0:
        raise UsageError("--steps must be at least 1 and --warmup at least 0")
    if args.try_repeats < 2:
        raise UsageError("--try-repeats must be at least 2 (the noise comes from the repeats)")
    if not args.budget > 0:
        raise UsageError("--budget must be a positive number of seconds")
    try:
        tries = parse_tries(args.tries)
    except ValueError as error:
        raise UsageError(str(error)) from None
    select, ignore = selectors(args)
    config = PerfConfig(warmup=args.warmup, steps=args.steps, tries=tries, try_seconds=args.try_seconds,
                        try_repeats=args.try_repeats, budget=args.budget, started=time.monotonic(),
                        try_all=any(p.strip().lower() == "all" for v in args.tries for p in v.split(",")))
    rank, channel = ranks_of_launch(target)
    output = ReportDelivery.from_args(args, also_scan=[] if target.is_module else [target.name])
    # Under torchrun rank 0 alone speaks: the other ranks' numbers reach its report.
    shows_text = not args.quiet and args.output_format == "text" and (rank is None or rank.is_leader)
    announce = (lambda line: print(f"nndoctor perf: {line}", file=sys.stderr, flush=True)) if shows_text else None
    if isinstance(channel, str) and shows_text:
        print(f"nndoctor perf: the ranks cannot reach torchrun's store ({channel}): each rank reports "
              "alone and --try re-runs only this rank", file=sys.stderr)
    with stdout_to_stderr(args.json == "-" or args.output_format == "json"), sigterm_interrupts() as signals:
        report, result = run_perf(target, config, select=select, ignore=ignore, announce=announce,
                                  rank=rank, channel=channel)
    channel = None if isinstance(channel, str) else channel
    diagnosis = result.diagnose()
    replace_estimates(report, diagnosis)
    for finding in diagnosis.findings:
        report.add(finding)
    filter_findings(report, select, ignore)
    step_class = diagnosis.step_class
    report.extra["perf"] = {**result.to_json(), "step_class": step_class,
                            "advice": order_advice(diagnosis.advice, step_class["class"])}
    perf = report.extra["perf"]
    interrupted = signals.received or ("SIGINT" if (perf.get("trials") or {}).get("interrupted") or
                                        report.status == "interrupted" else None)
    if interrupted:
        perf["interrupted"] = interrupted

    if channel is not None:
        merged = merge_ranks(report, perf, rank, channel, select, ignore)
        if merged is None:  # another rank: rank 0 reports for the launch; the script's own status
            from nndoctor.run.distributed.rank_run import script_status

            output.close()
            return 130 if interrupted else script_status(report)
        report, perf = merged, merged.extra["perf"]

    def show(stream, json_path) -> None:
        print("\n".join(["", *breakdown_lines(perf), *trial_lines(perf["trials"]), ""]), file=stream)
        print_report(report, stream, json_path=json_path)

    try:
        output.deliver(report, render_text=show)
    finally:
        output.close()
    if interrupted:  # as a shell shows it: 128 + the signal
        return 143 if interrupted == "SIGTERM" else 130
    return exit_status(report, fail_threshold(args))


def ranks_of_launch(target) -> tuple[Any, Any]:
    """(this rank, the ranks' store channel or why there is none) under torchrun, else (None, None)."""
    from nndoctor.run.distributed.context import torchrun_rank

    rank = torchrun_rank()
    if rank is None:
        return None, None
    from nndoctor.commands.perf.torch.ddp_trials import open_channel

    return rank, open_channel(rank)


def merge_ranks(report, perf: dict[str, Any], rank, channel, select, ignore):
    """Every rank posts its report part and numbers; rank 0 returns the merged report (its perf
    section with every rank's step and all-reduce time), the other ranks None."""
    from nndoctor.commands.perf.torch.ddp_trials import (
        gather_final,
        merge_perf,
        publish_final,
        rank_summary,
    )
    from nndoctor.core._version import __version__
    from nndoctor.run.distributed.merge import merge_parts

    part = {"rank": rank.rank, "world_size": rank.world_size, "pid": os.getpid(), "host": socket.gethostname(),
            "report": report.to_json(__version__), "data": {}}
    try:
        publish_final(channel, part, rank_summary(rank.rank, perf))
    except Exception as error:  # noqa: BLE001 - observer rule: this rank's numbers are missing, said so
        print(f"nndoctor perf: rank {rank.rank} could not post its numbers: {type(error).__name__}: {error}",
              file=sys.stderr)
    if not rank.is_leader:
        return None
    try:
        posts = gather_final(channel)
    except Exception as error:  # noqa: BLE001
        report.extra["perf"] = {**perf, "ranks_error": f"{type(error).__name__}: {error}"}
        return report
    parts = [post["part"] for post in posts]
    merged = merge_parts(parts, command=report.command, world_size=rank.world_size, select=list(select),
                         ignore=list(ignore))
    # The P findings (and their order) are rank 0's own, which carries the measured ones.
    merged.extra = {**merged.extra, **report.extra}
    merged.extra["perf"] = merge_perf(perf, [post["summary"] for post in posts], rank.world_size)
    return merged


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[Any]:
    """SIGTERM becomes a KeyboardInterrupt while perf runs, like Ctrl-C: the measured window or
    the trial in progress stops, and the report keeps everything that finished (``received``
    says which signal came). A second SIGTERM ends the process the default way."""
    state = _Signals()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        state.received = "SIGTERM"
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield state
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


class _Signals:
    received: str | None = None
