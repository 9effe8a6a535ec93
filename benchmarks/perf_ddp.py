"""`torchrun --nproc_per_node N -m nndoctor perf` on a DDP ResNet-50: does it finish within its
budget, with the all-reduce in the breakdown and DDP's settings measured?

Writes a DDP training script (synthetic images from a DataLoader with a DistributedSampler,
SGD with momentum, optional bf16 autocast and gradient accumulation without ``no_sync()``)
into ``--out``, runs ``nndoctor perf --try TRIES --budget B`` on it under torchrun, and saves:

- ``report.json`` (nndoctor's JSON report: ``extra.perf`` has the breakdown, ``communication``,
  ``ddp``, every rank's numbers under ``ranks`` and the trials), ``perf_stderr.txt`` (the text
  report and the progress lines), ``perf_stdout.txt``;
- ``summary.json``: wall time against the budget, the all-reduce numbers, each DDP trial's
  verdict, and whether the merged report has every rank.

Uses only what is installed (torch, torchvision for ``--model resnet50``) and nndoctor from
``PYTHONPATH=src``. On the 2-GPU machine:

    PYTHONPATH=$PWD/src python benchmarks/perf_ddp.py --gpus 2 --tries ddp --accumulate 2 --out $OUT/ddp
    PYTHONPATH=$PWD/src python benchmarks/perf_ddp.py --gpus 2 --tries all --bf16 --out $OUT/all

CPU dry run (gloo, a tiny CNN; checks the harness end to end, the numbers mean nothing):

    PYTHONPATH=$PWD/src python benchmarks/perf_ddp.py --device cpu --model tiny --tries ddp \
        --accumulate 2 --batch 8 --budget 120 --steps 5 --out /tmp/perf_ddp
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = '''"""DDP training on synthetic images, written by benchmarks/perf_ddp.py."""
import os
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

DEVICE, MODEL, BATCH, SIZE, BF16, ACCUMULATE = {device!r}, {model!r}, {batch}, {size}, {bf16}, {accumulate}

dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
local_rank = int(os.environ.get("LOCAL_RANK", "0"))
device = torch.device("cuda", local_rank) if DEVICE == "cuda" else torch.device("cpu")
if DEVICE == "cuda":
    torch.cuda.set_device(device)
torch.manual_seed(0)
if MODEL == "resnet50":
    import torchvision
    net = torchvision.models.resnet50(num_classes=1000)
else:
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1000))
model = DistributedDataParallel(net.to(device), device_ids=[local_rank] if DEVICE == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images = torch.randn(8 * BATCH, 3, SIZE, SIZE)
labels = torch.randint(0, 1000, (8 * BATCH,))
dataset = TensorDataset(images, labels)
loader = DataLoader(dataset, batch_size=BATCH, sampler=DistributedSampler(dataset), num_workers=2,
                    pin_memory=DEVICE == "cuda", persistent_workers=True, drop_last=True)
loss_fn = nn.CrossEntropyLoss()
micro = 0
for epoch in range(100000):
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16, enabled=BF16):
            loss = loss_fn(model(x), y) / ACCUMULATE
        loss.backward()
        micro += 1
        if micro % ACCUMULATE == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
dist.destroy_process_group()
'''


def write_script(folder: Path, args: argparse.Namespace) -> Path:
    path = folder / "ddp_train.py"
    size = 224 if args.model == "resnet50" else 32
    path.write_text(SCRIPT.format(device=args.device, model=args.model, batch=args.batch, size=size,
                                  bf16=args.bf16, accumulate=args.accumulate))
    return path


def summarize(report: dict, wall_s: float, args: argparse.Namespace, returncode: int) -> dict:
    perf = (report.get("extra") or {}).get("perf") or {}
    trials = perf.get("trials") or {}
    ddp_trials = {}
    for name in ("ddp-bucket-view", "ddp-static-graph", "ddp-bucket-cap", "ddp-no-sync"):
        result = trials.get(name) or {}
        ddp_trials[name] = {key: result.get(key) for key in
                            ("speedup", "pays_off", "base_s", "variant_s", "noise", "runs", "rank_seconds_per_step",
                             "applied", "skipped", "not_measured", "error") if result.get(key) is not None}
    budget = trials.get("budget") or {}
    return {
        "command": report.get("command"), "returncode": returncode, "wall_s": round(wall_s, 1),
        "budget_s": args.budget, "trials_budget_used_s": budget.get("used_s"),
        "within_budget": budget.get("used_s", 0) <= args.budget + budget.get("longest_re_run_s", 0),
        "ranks_in_report": sorted(r.get("rank") for r in report.get("ranks") or []),
        "perf_ranks": perf.get("ranks"), "slowest_rank": perf.get("slowest_rank"),
        "median_step_s": (perf.get("breakdown") or {}).get("median_step_s"),
        "ddp": perf.get("ddp"), "communication": perf.get("communication"),
        "ddp_trials": ddp_trials, "best": trials.get("best"),
        "other_trials": {name: (f"speedup {t['speedup']:.3f}" if "speedup" in t else
                                t.get("skipped") or t.get("not_measured") or t.get("error"))
                         for name, t in trials.items() if isinstance(t, dict) and name not in ddp_trials
                         and name not in ("baseline", "budget", "best", "combined")},
        "internal_errors": report.get("internal_errors"),
        "device": (perf.get("device") or {}).get("name"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the script, the report and summary.json")
    parser.add_argument("--gpus", type=int, default=2, help="processes (one GPU each on CUDA)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--model", choices=("resnet50", "tiny"), default="resnet50")
    parser.add_argument("--batch", type=int, default=64, help="images per rank per micro-batch")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast in the script")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="micro-batches per optimizer step, without no_sync() (2+: --try ddp-no-sync applies)")
    parser.add_argument("--tries", default="all", help="nndoctor perf --try (default all)")
    parser.add_argument("--budget", type=float, default=300.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=None, help="default: nndoctor perf's (8 under torchrun)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    script = write_script(out, args)
    report_path = out / "report.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.gpus}",
               "-m", "nndoctor", "perf", "--try", args.tries, "--budget", f"{args.budget:g}",
               "--steps", str(args.steps), *(["--warmup", str(args.warmup)] if args.warmup is not None else []),
               "--json", str(report_path), str(script)]
    env = dict(os.environ)
    source = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH", "")) if p)
    print("running:", " ".join(command), file=sys.stderr, flush=True)
    started = time.monotonic()
    with open(out / "perf_stdout.txt", "w") as stdout, open(out / "perf_stderr.txt", "w") as stderr:
        done = subprocess.run(command, cwd=out, env=env, stdout=stdout, stderr=stderr, check=False)
    wall = time.monotonic() - started
    if not report_path.exists():
        print(f"no report (exit {done.returncode}); see {out / 'perf_stderr.txt'}", file=sys.stderr)
        return 1
    summary = summarize(json.loads(report_path.read_text()), wall, args, done.returncode)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
