"""Overhead of nndoctor on DDP training: plain `torchrun` vs `torchrun -m nndoctor run`.

The driver launches the same DDP training script alternately plain and under nndoctor
(interleaved rounds, so machine drift hits both), each launch times steady-state steps after
the full-instrumentation window, and the driver prints the median step time of each side and
their ratio. It also checks that the nndoctor launches wrote one merged report (world_size,
every rank present).

    # 2 GPUs, NCCL, ResNet-50 (the numbers in benchmarks/README.md):
    python benchmarks/ddp_overhead.py --nproc 2 --device cuda --model resnet50 --amp bf16 \
        --channels-last --batch 128 --image-size 224 --rounds 3 --steps 100
    # CPU smoke run (gloo):
    python benchmarks/ddp_overhead.py --nproc 2 --rounds 1 --steps 20 --batch 16

With ``--train`` the script is the training side itself (what the driver launches).
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

HERE = os.path.dirname(os.path.abspath(__file__))
_MARK = "DDP_STEP_RESULT "


def train(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, HERE)
    from overhead import build_model

    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    torch.manual_seed(0)
    model = build_model(args.model).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model = DDP(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    classes = 1000 if args.model == "resnet50" else 10
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own data, as with a DistributedSampler
    batches = []
    for _ in range(4):
        x = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g).to(device)
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        batches.append((x, torch.randint(0, classes, (args.batch,), generator=g).to(device)))
    criterion = nn.CrossEntropyLoss()
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for i in range(args.warmup):  # past nndoctor's 16-step full-instrumentation window
        step(i)
    sync()
    began = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        step(i)
    sync()
    per_step = (time.perf_counter() - began) / args.steps
    if rank == 0:
        card = torch.cuda.get_device_name() if cuda else "CPU"
        print(_MARK + json.dumps({"ms": per_step * 1e3, "device": card,
                                  "world_size": dist.get_world_size()}), flush=True)
    dist.destroy_process_group()


def launch(args: argparse.Namespace, doctored: bool, workdir: str) -> tuple[float, dict, dict | None]:
    script_args = ["--train", "--device", args.device, "--model", args.model, "--batch", str(args.batch),
                   "--image-size", str(args.image_size), "--amp", args.amp, "--warmup", str(args.warmup),
                   "--steps", str(args.steps)] + (["--channels-last"] if args.channels_last else [])
    report_path = os.path.join(workdir, "report.json")
    if os.path.exists(report_path):
        os.unlink(report_path)
    nndoctor = ["-m", "nndoctor", "run", "--quiet", "--json", report_path] if doctored else []
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               *nndoctor, os.path.abspath(__file__), *script_args]
    result = subprocess.run(command, capture_output=True, text=True)
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith(_MARK)), None)
    if result.returncode != 0 or line is None:
        sys.exit(f"launch failed ({'nndoctor' if doctored else 'plain'}, exit {result.returncode}):\n"
                 f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    report = json.load(open(report_path)) if doctored and os.path.exists(report_path) else None
    measured = json.loads(line[len(_MARK):])
    return measured["ms"], measured, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="smallcnn", choices=["smallcnn", "resnet18", "resnet50"])
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100, help="timed steps per launch (one sampling period)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the numbers here too")
    args = parser.parse_args()
    if args.train:
        train(args)
        return
    plain, doctored, report, measured = [], [], None, {}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for side in order:
                ms, measured, got = launch(args, side, workdir)
                (doctored if side else plain).append(ms)
                report = got or report
            print(f"round {r + 1}: plain torchrun {plain[-1]:.2f} ms/step, "
                  f"torchrun -m nndoctor run {doctored[-1]:.2f} ms/step", flush=True)
    ratio = statistics.median(doctored) / statistics.median(plain)
    merged_ok = bool(report and report.get("world_size") == args.nproc and not report.get("missing_ranks")
                     and len(report.get("ranks", [])) == args.nproc)
    result = {
        "device": measured.get("device"), "nproc": args.nproc, "model": args.model, "batch_per_rank": args.batch,
        "amp": args.amp, "channels_last": args.channels_last, "rounds": args.rounds, "steps": args.steps,
        "plain_ms_median": statistics.median(plain), "nndoctor_ms_median": statistics.median(doctored),
        "ratio_of_medians": ratio, "per_round_ratios": [d / p for d, p in zip(doctored, plain)],
        "merged_report_ok": merged_ok,
        "findings": sorted({f["code"] for f in (report or {}).get("findings", [])}),
        "internal_errors": len((report or {}).get("internal_errors", [])),
    }
    print(json.dumps(result, indent=2))
    print(f"\nDDP step-time ratio (median torchrun -m nndoctor run / median plain torchrun) on "
          f"{args.nproc}× {result['device']}: {ratio:.3f}; one merged report: {merged_ok}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
