"""Where nndoctor's time per step goes: cProfile of the same patient, plain and under the CLI.

``ddp_overhead.py`` says *how much* a step costs under ``nndoctor run``; this says *where*. The
patient of ``ddp_overhead.py`` (default: the launch-bound MLP on one GPU) runs twice under
cProfile, ``python train.py`` and ``python -m nndoctor run train.py``; the functions are
compared by exclusive time per timed step, and the ones nndoctor adds or makes slower are
printed first, largest first. Only the timed steps are profiled (the patient turns cProfile on
after its warm-up, in its main thread). cProfile inflates Python calls more than C calls, so read the
ranking, not the absolute microseconds (those come from ``ddp_overhead.py``).

    python benchmarks/step_profile.py                              # MLP on cuda, 3,000 steps
    NNDOCTOR_SAMPLE_EVERY=1000000 python benchmarks/step_profile.py  # unsampled steps only
    python benchmarks/step_profile.py --device cpu --steps 500      # smoke run
"""

from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def profile(args: argparse.Namespace, doctored: bool, folder: str) -> pstats.Stats:
    out = os.path.join(folder, "doctored.prof" if doctored else "plain.prof")
    patient = [os.path.join(HERE, "ddp_overhead.py"), "--train", "--device", args.device, "--model", args.model,
               "--batch", str(args.batch), "--image-size", "32", "--amp", "none",
               "--warmup", str(args.warmup), "--steps", str(args.steps)]
    nndoctor = ["-m", "nndoctor", "run", "--quiet", "--json", os.path.join(folder, "report.json")] if doctored else []
    command = [sys.executable, *nndoctor, *patient]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "STEP_PROFILE_OUT": out})
    if result.returncode != 0:
        sys.exit(f"{'doctored' if doctored else 'plain'} run failed:\n{result.stderr[-3000:]}")
    return pstats.Stats(out)


def by_function(stats: pstats.Stats) -> dict[str, tuple[int, float]]:
    """(calls, exclusive seconds) by ``file:line(function)``."""
    table = {}
    for (path, line, name), (_, calls, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        table[f"{os.path.basename(path)}:{line}({name})"] = (calls, tottime)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        plain = by_function(profile(args, False, folder))
        doctored = by_function(profile(args, True, folder))
    steps = args.steps
    total = {side: sum(t for _, t in table.values()) for side, table in (("plain", plain), ("doctored", doctored))}
    print(f"exclusive time per step under cProfile: plain {total['plain'] / steps * 1e6:.0f} µs, "
          f"doctored {total['doctored'] / steps * 1e6:.0f} µs ({steps} timed steps each)")
    rows = []
    for key in set(plain) | set(doctored):
        calls_p, time_p = plain.get(key, (0, 0.0))
        calls_d, time_d = doctored.get(key, (0, 0.0))
        rows.append((time_d - time_p, key, calls_p, calls_d, time_p, time_d))
    rows.sort(reverse=True)
    print(f"{'extra µs/step':>13} {'calls/step plain':>16} {'doctored':>9}  function")
    for extra, key, calls_p, calls_d, _, _ in rows[: args.top]:
        print(f"{extra / steps * 1e6:13.2f} {calls_p / steps:16.2f} {calls_d / steps:9.2f}  {key}")


if __name__ == "__main__":
    main()
