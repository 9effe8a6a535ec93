"""What `nndoctor run` costs per step when steps are short: a tiny MLP on CPU, plain vs the CLI.

A step of a 64-sample MLP (64×32 → 32 → 10, SGD) takes ~0.15 ms on one CPU core: nndoctor's
fixed cost per step (hooks, event dispatch, the checks' every-step handlers) shows here as it
would on a launch-bound GPU loop. The driver launches the same script as separate processes,
``python patient.py`` and ``python -m nndoctor run patient.py`` (every check), alternating
the order each round; each launch times **all** steps after the warm-up (sampled steps
included, one in 100), on the wall clock and on the process's CPU clock (which time taken by
other jobs on a shared machine inflates less). Printed: each side's µs per step, the extra µs
per step and the ratio, per round and as medians over rounds.

    python benchmarks/short_step_overhead.py                       # 7 rounds × 20,000 steps, ~3 min
    python benchmarks/short_step_overhead.py --sides plain,all,none --rounds 5   # none: --ignore ALL
    # watch: every check through nndoctor.watch() in the script (what `nndoctor run` adds shows
    # against "all"); --count: Python calls and ATen ops per unsampled step too (load-independent)
    python benchmarks/short_step_overhead.py --sides plain,watch,all,none --count --rounds 3
    python benchmarks/short_step_overhead.py --rounds 1 --steps 500 # smoke run
    # a small ResNet-like CNN (8 residual blocks, 62 module calls a forward; 8 images of 3×16×16):
    # what nndoctor costs per module call shows here
    python benchmarks/short_step_overhead.py --model cnn --steps 2000 --rounds 3
    # before/after a change: a side "all@SRC" imports nndoctor from SRC (PYTHONPATH)
    python benchmarks/short_step_overhead.py --sides plain,all,all@../main/src --steps 5000

With ``--patient`` the script is the patient itself (what the driver launches).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_MARK = "SHORT_STEP_RESULT "
# The doctored sides: every check, the engine and hooks alone, or a selection.
SIDES = {"plain": None, "all": [], "none": ["--ignore", "ALL"]}  # and "watch": nndoctor.watch() in the script


def patient(args: argparse.Namespace) -> None:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if args.model == "cnn":
        model = _small_resnet(nn)
        batches = [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g))
                   for _ in range(8)]
    else:
        model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))
        batches = [(torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(8)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()

    def train(first: int, last: int) -> None:
        for i in range(first, last):
            x, y = batches[i % len(batches)]
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()

    def run() -> dict:
        train(0, args.warmup)  # past nndoctor's 16-step full-instrumentation window
        start, counted = args.warmup, {}
        if args.count:
            # Before the timed steps (L108 watches the first 2,000), unsampled steps only (one in
            # 100 is sampled): two windows of 96 steps, from 2 past a multiple of 100.
            first = (start // 100 + 1) * 100 + 2
            train(start, first)
            counted = _counted_per_step(train, first)
            start = first + 200
        wall, cpu = time.perf_counter(), time.process_time()
        train(start, start + args.steps)
        return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "steps": args.steps,
                **counted}

    if args.watch:  # the in-process API instead of the CLI
        import nndoctor

        with nndoctor.watch():
            measured = run()
    else:
        measured = run()
    print(_MARK + json.dumps(measured), flush=True)


_COUNTED = 96  # unsampled steps counted for calls and ops per step


def _counted_per_step(train, first: int) -> dict:
    """Python calls (cProfile: functions and builtins, user code and torch's included) and
    ATen ops (each a kernel launch on a GPU) per unsampled step: numbers the machine's load does
    not change."""
    import cProfile
    import pstats

    from torch.utils._python_dispatch import TorchDispatchMode

    last = first + _COUNTED
    profile = cProfile.Profile()
    profile.enable()
    train(first, last)
    profile.disable()
    train(last, first + 100)
    calls = sum(entry[1] for entry in pstats.Stats(profile).stats.values())  # type: ignore[attr-defined]

    class CountOps(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountOps.ops += 1
            return func(*args, **(kwargs or {}))

    with CountOps():
        train(first + 100, last + 100)
    train(last + 100, first + 200)
    return {"calls_per_step": calls / _COUNTED, "ops_per_step": CountOps.ops / _COUNTED}


def _small_resnet(nn):
    """A ResNet-like CNN small enough for one CPU core: a stem, 8 residual blocks of
    conv-BN-ReLU-conv-BN, pooling and a linear head (62 module calls a forward)."""

    class Block(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(x + self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))))

    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), *[Block(8) for _ in range(8)],
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def launch(args: argparse.Namespace, side: str, workdir: str) -> dict:
    script = ["--patient", "--steps", str(args.steps), "--warmup", str(args.warmup), "--model", args.model]
    if args.count:
        script.append("--count")
    checks, _, source = side.partition("@")
    if checks == "watch":  # every check, through nndoctor.watch() inside the script
        script.append("--watch")
        checks = "plain"
    extra = SIDES[checks] if checks in SIDES else ["--select", checks]
    report = os.path.join(workdir, f"{len(os.listdir(workdir))}.json")
    nndoctor = [] if extra is None else ["-m", "nndoctor", "run", "--quiet", "--json", report, *extra]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(source)) if source else None
    result = subprocess.run([sys.executable, *nndoctor, os.path.abspath(__file__), *script],
                            capture_output=True, text=True, env=env)
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith(_MARK)), None)
    if line is None:
        sys.exit(f"{side} launch failed (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    measured = json.loads(line[len(_MARK):])
    if extra is not None:
        with open(report) as handle:
            written = json.load(handle)
        measured["internal_errors"] = len(written.get("internal_errors", []))
        measured["findings"] = sorted({f["code"] for f in written.get("findings", [])})
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patient", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--watch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", action="store_true",
                        help="also count Python calls and ATen ops per unsampled step (2 × 96 steps before the timed ones)")
    parser.add_argument("--steps", type=int, default=20000, help="timed steps per launch")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                        help="mlp: 64×32 → 32 → 10 (the default); cnn: a small ResNet-like CNN")
    parser.add_argument("--sides", default="plain,all",
                        help="comma-separated: plain, watch (nndoctor.watch()), all (every check), none (--ignore ALL), "
                             "or check codes; "
                             "SIDE@SRC imports nndoctor from SRC")
    parser.add_argument("--json", help="write the numbers here too")
    args = parser.parse_args()
    if args.patient:
        patient(args)
        return
    sides = args.sides.split(",")
    if sides[0] != "plain":
        sides.insert(0, "plain")
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            for side in (sides if r % 2 == 0 else sides[::-1]):
                runs[side].append(launch(args, side, workdir))
            line = ", ".join(f"{s} {runs[s][-1]['wall_s'] / args.steps * 1e6:.1f}/{runs[s][-1]['cpu_s'] / args.steps * 1e6:.1f}"
                             for s in sides)
            print(f"round {r + 1}: µs/step wall/CPU: {line}", flush=True)
    result: dict = {"model": args.model, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
                    "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
                    "torch_threads": 1, "sides": {}}
    plain = runs["plain"]
    for side in sides:
        entry: dict = {}
        for clock in ("wall", "cpu"):
            per_step = [run[f"{clock}_s"] / args.steps * 1e6 for run in runs[side]]
            entry[f"{clock}_us_per_step_median"] = statistics.median(per_step)
            if side != "plain":
                base = [run[f"{clock}_s"] / args.steps * 1e6 for run in plain]
                ratios = [d / p for d, p in zip(per_step, base)]
                entry[f"{clock}_ratios"] = [round(x, 4) for x in ratios]
                entry[f"{clock}_ratio_median"] = statistics.median(ratios)
                entry[f"{clock}_extra_us_per_step_median"] = statistics.median(d - p for d, p in zip(per_step, base))
        if args.count:
            entry["calls_per_step"] = runs[side][-1]["calls_per_step"]
            entry["ops_per_step"] = runs[side][-1]["ops_per_step"]
        if "internal_errors" in runs[side][-1]:
            entry["internal_errors"] = max(run["internal_errors"] for run in runs[side])
            entry["findings"] = runs[side][-1]["findings"]
        result["sides"][side] = entry
    print(json.dumps(result, indent=2))
    for side in sides[1:]:
        e = result["sides"][side]
        print(f"{side}: plain {result['sides']['plain']['wall_us_per_step_median']:.1f} µs/step; "
              f"extra {e['wall_extra_us_per_step_median']:+.1f} µs/step wall ({e['cpu_extra_us_per_step_median']:+.1f} CPU); "
              f"ratio (median of {args.rounds} rounds) wall {e['wall_ratio_median']:.3f}, CPU {e['cpu_ratio_median']:.3f}")
    if args.count:
        print("per unsampled step: " + "; ".join(
            f"{side} {result['sides'][side]['calls_per_step']:.0f} Python calls, {result['sides'][side]['ops_per_step']:.0f} ATen ops"
            for side in sides))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
