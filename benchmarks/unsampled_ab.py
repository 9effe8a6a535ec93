"""What an unsampled step costs, in one process: the same session switched off and on, block by block.

Separate launches of a GPU patient differ by ±10–25% (benchmarks/README.md), far more than the
microseconds a step this measures. Here the MLP patient of ``ddp_overhead.py`` runs in one
process under every check (``install(Session())``, as ``nndoctor run`` installs it); after a
warm-up past every check's settling window, blocks of steps alternate between the session
switched off (``session.active = False``: each hook returns at its first test, as before
``install``) and on, the order swapped every cycle. No step of the timed blocks is sampled
(``sample_every`` far beyond them): what this reports is the steady unsampled step, the one a
launch-bound loop pays on almost every step. Printed: median ms a step of each side, the
median of the paired differences in µs a step, and their ratio.

    python benchmarks/unsampled_ab.py --device cuda                 # ~1 minute on a GPU
    python benchmarks/unsampled_ab.py --device cpu --cycles 6       # the CPU patient (~0.3 ms a step)
    python benchmarks/unsampled_ab.py --device cpu --profile 2000   # plus cProfile of 2,000 steps on
    python benchmarks/unsampled_ab.py --device cpu --tiny --ddp     # under DDP (one gloo process)

The sampled steps (one in 100 by default, their interval widened by the sampling budget) are
measured by ``ddp_overhead.py``, which times every step of separate launches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def build(device, tiny: bool):
    import torch
    from torch import nn

    sys.path.insert(0, HERE)
    from ddp_overhead import _model_and_batches

    if device.type == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(0)
    model, batches = _model_and_batches(argparse.Namespace(model="mlp", labels="teacher", batch=32), device, 0)
    if tiny:  # the same loop, loader and modules, 4 features wide: almost all of a step is host overhead
        model = nn.Sequential(*[nn.Linear(4 if i == 0 else 4, 4) if isinstance(m, nn.Linear) else m
                                for i, m in enumerate(model)][:-1], nn.Linear(4, 10)).to(device)
        from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

        g = torch.Generator().manual_seed(1)
        x = torch.randn(4096, 4, generator=g)
        dataset = TensorDataset(x.to(device), (x @ torch.randn(4, 10, generator=g)).argmax(1).to(device))
        sampler = BatchSampler(RandomSampler(dataset, generator=torch.Generator().manual_seed(1)), 8, drop_last=True)
        loader = DataLoader(dataset, sampler=sampler, batch_size=None)

        def cycle():
            while True:
                yield from loader
        batches = cycle()
    return model, batches, torch.optim.Adam(model.parameters(), lr=1e-3), nn.CrossEntropyLoss()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=2500, help="steps on, before timing (past L108's window)")
    parser.add_argument("--block", type=int, default=400, help="steps per timed block")
    parser.add_argument("--cycles", type=int, default=10, help="off/on pairs")
    parser.add_argument("--profile", type=int, default=0, help="then cProfile this many steps on (top functions)")
    parser.add_argument("--count", type=int, default=0,
                        help="also count Python and C function calls a step over this many steps, off and on "
                             "(sys.setprofile: exact, load-independent)")
    parser.add_argument("--tiny", action="store_true",
                        help="4 features wide, batches of 8: a step that is nearly all host overhead "
                             "(on a CPU, what a launch-bound GPU step pays)")
    parser.add_argument("--ddp", action="store_true",
                        help="wrap the model in DistributedDataParallel (one process: gloo on the CPU, "
                             "NCCL on CUDA): what the X family and the DDP hooks add")
    parser.add_argument("--select", default="", help="comma-separated codes (default: every check)")
    parser.add_argument("--ignore", default="")
    parser.add_argument("--json", help="write the numbers here too")
    args = parser.parse_args()

    import torch

    from nndoctor.core.engine import Session
    from nndoctor.instrument.extensions import install

    device = torch.device(args.device)
    session = Session(select=[c for c in args.select.split(",") if c], ignore=[c for c in args.ignore.split(",") if c],
                      sample_every=10**9, sample_budget=0)
    installation = install(session)
    session.active = True
    model, batches, optimizer, criterion = build(device, args.tiny)
    if args.ddp:
        import socket

        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        model = DistributedDataParallel(model, device_ids=[device.index or 0] if device.type == "cuda" else None)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def train(steps: int) -> None:
        for _ in range(steps):
            x, y = next(batches)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            loss.item()

    train(args.warmup)
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu_times: dict[bool, list[float]] = {False: [], True: []}  # the training thread's CPU clock
    for cycle in range(args.cycles):
        for on in ((False, True) if cycle % 2 == 0 else (True, False)):
            session.active = on
            sync()
            began, cpu = time.perf_counter(), time.thread_time()
            train(args.block)
            sync()
            times[on].append((time.perf_counter() - began) / args.block * 1e6)
            cpu_times[on].append((time.thread_time() - cpu) / args.block * 1e6)
    counted = {}
    if args.count:
        for on in (False, True):
            session.active = on
            counted["calls_per_step_" + ("on" if on else "off")] = _calls_per_step(train, args.count)
    session.active = True
    off, on = statistics.median(times[False]), statistics.median(times[True])
    paired = [b - a for a, b in zip(times[False], times[True])]
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)",
        "torch": torch.__version__, "python": sys.version.split()[0], "block": args.block, "cycles": args.cycles,
        "select": args.select, "ignore": args.ignore, "ddp": args.ddp,
        "off_us_per_step": times[False], "on_us_per_step": times[True],
        "median_off_us": off, "median_on_us": on, "median_extra_us": statistics.median(paired),
        "ratio": on / off,
        "median_extra_cpu_us": statistics.median(b - a for a, b in zip(cpu_times[False], cpu_times[True])), "steps_counted": session.step, "internal_errors": len(session.report.internal_errors),
        **counted,
    }
    print(json.dumps(result, indent=1))
    print(f"\nunsampled step, {result['device']}: off {off:.1f} µs, on {on:.1f} µs; extra "
          f"{result['median_extra_us']:.1f} µs a step (median of {args.cycles} pairs; thread CPU "
          f"{result['median_extra_cpu_us']:.1f} µs), ratio {on / off:.3f}")
    if counted:
        print(f"calls a step: off {counted['calls_per_step_off']:.1f}, on {counted['calls_per_step_on']:.1f}")
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        train(args.profile)
        profiler.disable()
        stats = pstats.Stats(profiler)
        rows = sorted(((s[2], s[1], f"{os.path.basename(f[0])}:{f[1]}({f[2]})")
                       for f, s in stats.stats.items() if "nndoctor" in f[0]), reverse=True)
        print(f"\nnndoctor's functions under cProfile, per step ({args.profile} steps): exclusive µs, calls")
        for tottime, calls, name in rows[:40]:
            print(f"{tottime / args.profile * 1e6:8.2f} {calls / args.profile:6.2f}  {name}")
    installation.uninstall()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


def _calls_per_step(train, steps: int) -> float:
    """Function calls (Python and C) in ``steps`` steps, per step."""
    calls = 0

    def count(frame, event, arg) -> None:
        nonlocal calls
        if event == "call" or event == "c_call":
            calls += 1

    sys.setprofile(count)
    try:
        train(steps)
    finally:
        sys.setprofile(None)
    return calls / steps


if __name__ == "__main__":
    main()
