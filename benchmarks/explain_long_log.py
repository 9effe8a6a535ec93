"""Time ``nndoctor explain`` on a long log (the issue's bar: a 2 MB log in under a second).

The log is built from the real logs in tests/explain/pasted/ (each case's text, in turn) with
ordinary training output between them (progress lines, logger lines with timestamps and rank
prefixes), repeated until it reaches the size asked for, so every path of the reader runs:
tracebacks, C++ and launcher lines, warnings and the line scan. Prints the size, the number
of lines, the wall time of the first ``explain_all`` call (in-process, checks imported; it
compiles every pattern, as the CLI's one call does) and the best and median of ``--repeat`` more.

    PYTHONPATH=src python benchmarks/explain_long_log.py            # 2 MB, best of 5
    PYTHONPATH=src python benchmarks/explain_long_log.py --mb 8
    PYTHONPATH=src python benchmarks/explain_long_log.py --cli 3    # also `nndoctor explain FILE`, 3 runs

``--cli N`` also runs the command end to end N times in fresh processes (start-up, imports,
reading the file, the report) and prints the median wall time, the median CPU time (user +
system: what the load of a shared machine does not inflate) and the load average.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nndoctor.commands.explain.cli import explain_all

PASTED = Path(__file__).resolve().parent.parent / "tests" / "explain" / "pasted"
FILLER = (
    "[rank0]:[I1127 12:00:01.123456 4242 trainer.py:88] step 1200 loss 2.3141 lr 3.0e-04 grad_norm 0.873\n"
    "2026-11-27 12:00:01,123 - INFO - __main__ - Epoch 3:  41%|████      | 412/1000 [01:02<01:29,  6.61it/s]\n"
    "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py:558: UserWarning: This DataLoader will create 8 "
    "worker processes in total.\n"
)


def build_log(size_bytes: int) -> str:
    logs = [path.read_text(encoding="utf-8").partition("\n---\n")[2] for path in sorted(PASTED.glob("*.txt"))]
    parts: list[str] = []
    total = 0
    index = 0
    while total < size_bytes:
        chunk = FILLER * 20 + logs[index % len(logs)] + "\n"
        parts.append(chunk)
        total += len(chunk.encode("utf-8"))
        index += 1
    return "".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=2.0, help="size of the log in MB (default 2)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs; the best is printed (default 5)")
    parser.add_argument("--cli", type=int, default=0, metavar="N",
                        help="also time `python -m nndoctor explain FILE` end to end, N runs (default 0: not)")
    args = parser.parse_args()
    text = build_log(int(args.mb * 1_000_000))
    from nndoctor.commands.explain.base import explanations

    explanations()  # imports the check families (the CLI does it before reading the log)
    times = []
    for _ in range(args.repeat + 1):
        started = time.perf_counter()
        result = explain_all(text)
        times.append(time.perf_counter() - started)
    size = len(text.encode("utf-8"))
    print(f"log: {size / 1e6:.2f} MB, {text.count(chr(10)):,} lines, {result.tracebacks:,} tracebacks, "
          f"{len(result.findings)} distinct causes, {len(result.unexplained)} unexplained")
    print(f"explain_all: first call {times[0]:.3f} s (compiles every pattern), then best {min(times[1:]):.3f} s, "
          f"median {sorted(times[1:])[len(times[1:]) // 2]:.3f} s of {len(times) - 1} runs")
    if args.cli:
        time_cli(text, args.cli)


def time_cli(text: str, runs: int) -> None:
    """Median wall and CPU seconds of ``python -m nndoctor explain FILE`` in fresh processes."""
    with tempfile.TemporaryDirectory() as folder:
        log = os.path.join(folder, "long.log")
        with open(log, "w", encoding="utf-8") as handle:
            handle.write(text)
        command = [sys.executable, "-m", "nndoctor", "explain", log]
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)  # warm caches
        walls, cpus = [], []
        for _ in range(runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            walls.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"nndoctor explain FILE (CLI, end to end): median wall {statistics.median(walls):.2f} s "
          f"({', '.join(f'{w:.2f}' for w in walls)}), median CPU {statistics.median(cpus):.2f} s; "
          f"load average {load} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
