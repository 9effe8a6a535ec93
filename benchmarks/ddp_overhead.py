"""What `nndoctor run` costs the user in throughput: plain vs the CLI, on 1 or N GPUs.

The driver launches the same training script alternately plain and under nndoctor (every
runtime check), in separate processes, interleaved (the order alternates each round, so drift
in the machine hits both sides). With ``--gpus 1`` the sides are ``python train.py`` and
``python -m nndoctor run train.py``; with ``--gpus N > 1`` they are ``torchrun
--nproc_per_node N train.py`` and ``torchrun --nproc_per_node N -m nndoctor run train.py``
(DDP). Each launch times **all** steps after the warm-up on the wall clock (the device
synchronised at both ends): sampled steps, where the checks do their work (one in 100 after
the first 16), are included, as the user pays them. The headline is the throughput ratio:
the nndoctor launches' total time over the plain launches' total time for the same steps;
the per-round ratios and their median are written too.

Two patients:

- ``--model resnet50``: DDP ResNet-50, bf16 autocast, channels_last, 128 images per rank at
  224 px, batches resident on the device (each rank its own), SGD with momentum.
- ``--model mlp``: the launch-bound small MLP of ``perf_patients.py`` (64 → 4×256 → 10, batch
  32 from a DataLoader over a BatchSampler of device-resident data, Adam, ``loss.item()``
  every step): ≈ 2 ms a step on one GPU, dominated by the host's kernel launches, so every
  microsecond nndoctor spends per step shows. Its labels are a fixed random teacher's
  (``argmax(x @ W)``): a task the model learns, as in a correct program. Until session 33 they
  were random (``--labels random``): chance-level labels, which nndoctor reports (L108) after
  watching predictions on each of the first 2,000 steps (two kernels a step) — a bug's cost,
  not a correct program's.

Commands the benchmarks/README.md numbers come from (each ≤ 4 minutes on H100s)::

    python benchmarks/ddp_overhead.py --gpus 1 --model resnet50 --out $OUT
    python benchmarks/ddp_overhead.py --gpus 2 --model resnet50 --out $OUT
    python benchmarks/ddp_overhead.py --gpus 4 --model resnet50 --out $OUT
    python benchmarks/ddp_overhead.py --gpus 1 --model mlp --out $OUT
    # less run-to-run noise for the same device time: more, shorter rounds (each an A/B pair in
    # alternating order); the median of the pair ratios and its quartiles are printed beside the
    # ratio of the summed times
    python benchmarks/ddp_overhead.py --gpus 1 --model mlp --rounds 12 --steps 1500 --out $OUT
    # CPU smoke runs (gloo; seconds, numbers meaningless):
    python benchmarks/ddp_overhead.py --device cpu --gpus 2 --model smallcnn --rounds 1 --steps 30 --batch 8
    python benchmarks/ddp_overhead.py --device cpu --gpus 1 --model mlp --rounds 1 --steps 200

With ``--train`` the script is the training side itself (what the driver launches).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_MARK = "DDP_STEP_RESULT "
# Per model: (warm-up steps, timed steps, rounds) that resolve ~1% within ~4 minutes on H100s.
_PROFILE_OUT = "STEP_PROFILE_OUT"
DEFAULTS = {"resnet50": (30, 400, 3), "resnet18": (30, 400, 3), "smallcnn": (20, 300, 3), "mlp": (50, 5000, 4)}


def _model_and_batches(args, device, rank: int):
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(1 + rank)  # each rank its own data, as with a DistributedSampler
    if args.model == "mlp":
        from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

        layers, width = [], 64
        for _ in range(4):
            layers += [nn.Linear(width, 256), nn.ReLU()]
            width = 256
        model = nn.Sequential(*layers, nn.Linear(width, 10)).to(device)
        x = torch.randn(65536, 64, generator=g)
        if args.labels == "random":  # noise: nndoctor rightly reports L108 and watches 2,000 steps for it
            y = torch.randint(0, 10, (65536,), generator=g)
        else:  # a teacher's labels: a task the model learns, as a correct program's is
            y = (x @ torch.randn(64, 10, generator=g)).argmax(1)
        x, y = x.to(device), y.to(device)
        dataset = TensorDataset(x, y)
        sampler = BatchSampler(RandomSampler(dataset, generator=torch.Generator().manual_seed(1 + rank)),
                               batch_size=args.batch, drop_last=True)
        loader = DataLoader(dataset, sampler=sampler, batch_size=None)

        def batches():
            while True:
                yield from loader
        return model, batches()
    sys.path.insert(0, HERE)
    from overhead import build_model

    model = build_model(args.model).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    classes = 1000 if args.model == "resnet50" else 10
    resident = []
    for _ in range(4):
        x = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g).to(device)
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        resident.append((x, torch.randint(0, classes, (args.batch,), generator=g).to(device)))

    def cycle():
        while True:
            yield from resident
    return model, cycle()


def train(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = args.device == "cuda"
    distributed = "WORLD_SIZE" in os.environ
    rank, local_rank = 0, int(os.environ.get("LOCAL_RANK", 0))
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
        rank = dist.get_rank()
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    torch.manual_seed(0)
    model, stream = _model_and_batches(args, device, rank)
    if distributed:
        model = DDP(model, device_ids=[local_rank] if cuda else None)
    if args.model == "mlp":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    running = 0.0

    def step() -> None:
        nonlocal running
        x, y = next(stream)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        if args.model == "mlp":
            running += loss.item()  # the patient reads its loss every step (a sync, launch-bound)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(args.warmup):  # past nndoctor's 16-step full-instrumentation window
        step()
    sync()
    profiler = _loop_profiler()
    audit = _SyncAudit.start(rank) if cuda and os.environ.get(_SYNC_AUDIT_OUT) else None
    began = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = time.perf_counter() - began
    if audit is not None:
        audit.finish(args.steps)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(os.environ[_PROFILE_OUT])
    if rank == 0:
        card = torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})"
        print(_MARK + json.dumps({"seconds": seconds, "steps": args.steps, "device": card,
                                  "torch": torch.__version__,
                                  "world_size": dist.get_world_size() if distributed else 1}), flush=True)
    if distributed:
        dist.destroy_process_group()


_SYNC_AUDIT_OUT = "SYNC_AUDIT_OUT"


class _SyncAudit:
    """Which calls synchronise the host with the GPU during the timed steps, and how often:
    ``torch.cuda.set_sync_debug_mode("warn")`` flags each synchronising operation (``item``,
    ``tolist``, a blocking device-to-host copy, ``nonzero`` …); the call site is the innermost
    frame outside torch. A plain launch lists the patient's own (the MLP's ``loss.item()``);
    anything more under nndoctor is a pipeline stall that nndoctor added. Written as JSON to
    ``$SYNC_AUDIT_OUT.rank<N>.json`` (``benchmarks/ddp_overhead.py --sync-audit``)."""

    def __init__(self, rank: int) -> None:
        import collections
        import warnings

        self.rank, self.counts = rank, collections.Counter()
        self._warnings, self._previous = warnings, warnings.showwarning

    @classmethod
    def start(cls, rank: int) -> _SyncAudit:
        import torch

        audit = cls(rank)
        audit._warnings.showwarning = audit._seen
        audit._warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        return audit

    def _seen(self, message, category, filename, lineno, file=None, line=None) -> None:
        import traceback

        if "synchronizing" not in str(message):
            return self._previous(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename
                  and "warnings" not in f.filename and f.filename != __file__]
        site = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}({f.name})" for f in frames[-3:][::-1])
        self.counts[site or f"{os.path.basename(filename)}:{lineno}"] += 1

    def finish(self, steps: int) -> None:
        import torch

        torch.cuda.set_sync_debug_mode(0)
        self._warnings.showwarning = self._previous
        with open(f"{os.environ[_SYNC_AUDIT_OUT]}.rank{self.rank}.json", "w") as handle:
            json.dump({"steps": steps, "syncs_per_step": sum(self.counts.values()) / steps,
                       "sites": {site: n / steps for site, n in self.counts.most_common()}}, handle, indent=2)


def _loop_profiler():
    """cProfile of the timed steps only, into $STEP_PROFILE_OUT when set (benchmarks/step_profile.py)."""
    if not os.environ.get(_PROFILE_OUT):
        return None
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def launch(args: argparse.Namespace, doctored: bool, workdir: str) -> tuple[dict, dict | None]:
    script_args = ["--train", "--device", args.device, "--model", args.model, "--batch", str(args.batch),
                   "--image-size", str(args.image_size), "--amp", args.amp, "--warmup", str(args.warmup),
                   "--steps", str(args.steps), "--labels", args.labels] + (["--channels-last"] if args.channels_last else [])
    report_path = os.path.join(workdir, "report.json")
    if os.path.exists(report_path):
        os.unlink(report_path)
    nndoctor = ["-m", "nndoctor", "run", "--quiet", "--json", report_path,
                *args.nndoctor_args.split()] if doctored else []
    if args.gpus > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.gpus}"]
        command = [*launcher, *nndoctor, os.path.abspath(__file__), *script_args]
    else:
        command = [sys.executable, *nndoctor, os.path.abspath(__file__), *script_args]
    result = subprocess.run(command, capture_output=True, text=True)
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith(_MARK)), None)
    if result.returncode != 0 or line is None:
        sys.exit(f"launch failed ({'nndoctor' if doctored else 'plain'}, exit {result.returncode}):\n"
                 f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    report = json.load(open(report_path)) if doctored and os.path.exists(report_path) else None
    return json.loads(line[len(_MARK):]), report


def summarize(args: argparse.Namespace, plain: list[dict], doctored: list[dict], report: dict | None) -> dict:
    p = [run["seconds"] for run in plain]
    d = [run["seconds"] for run in doctored]
    per_round = [b / a for a, b in zip(p, d)]
    if args.gpus > 1:
        report_ok = bool(report and report.get("world_size") == args.gpus and not report.get("missing_ranks")
                         and len(report.get("ranks", [])) == args.gpus)
    else:
        report_ok = report is not None
    return {
        "device": plain[-1].get("device"), "torch": plain[-1].get("torch"), "gpus": args.gpus,
        "launcher": "torchrun" if args.gpus > 1 else "python", "model": args.model,
        "batch_per_rank": args.batch, "amp": args.amp, "channels_last": args.channels_last,
        "labels": args.labels if args.model == "mlp" else None,
        "warmup_steps": args.warmup, "timed_steps": args.steps, "rounds": args.rounds,
        "nndoctor_args": args.nndoctor_args,
        "plain_ms_per_step": [s / args.steps * 1e3 for s in p],
        "nndoctor_ms_per_step": [s / args.steps * 1e3 for s in d],
        "throughput_ratio": sum(d) / sum(p),  # all timed steps of all rounds, sampled ones included
        "per_round_ratios": per_round, "median_round_ratio": statistics.median(per_round),
        # The spread of the pair ratios: what run-to-run noise leaves of the headline.
        "round_ratio_quartiles": (statistics.quantiles(per_round, n=4, method="inclusive") if len(per_round) > 1 else per_round * 3),
        "report_ok": report_ok,
        "findings": sorted({f["code"] for f in (report or {}).get("findings", [])}),
        "internal_errors": len((report or {}).get("internal_errors", [])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gpus", "--nproc", dest="gpus", type=int, default=1,
                        help="processes (one per GPU); >1 runs DDP under torchrun")
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"], help="cpu: the gloo smoke run")
    parser.add_argument("--model", default="resnet50", choices=sorted(DEFAULTS))
    parser.add_argument("--batch", type=int, help="per rank (default: 128 for ResNets, 32 otherwise)")
    parser.add_argument("--image-size", type=int, help="default: 224 for ResNets, 32 otherwise")
    parser.add_argument("--amp", choices=["none", "bf16", "fp16"], help="default: bf16 for ResNets on cuda")
    parser.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                        help="default: on for ResNets")
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--steps", type=int, help="timed steps per launch")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--labels", choices=("teacher", "random"), default="teacher",
                        help="mlp: labels a model can learn (a correct program), or random ones (the "
                             "patient of sessions 26-32: chance-level labels, which L108 reports)")
    parser.add_argument("--nndoctor-args", default="",
                        help="extra options of the nndoctor side, to bisect a cost: '--ignore ALL' (hooks "
                             "and engine alone), '--select X104' …")
    parser.add_argument("--out", help="write the result as JSON into this folder")
    parser.add_argument("--json", help="write the result as JSON to this file")
    args = parser.parse_args()
    resnet = args.model.startswith("resnet")
    warmup, steps, rounds = DEFAULTS[args.model]
    args.warmup = warmup if args.warmup is None else args.warmup
    args.steps = steps if args.steps is None else args.steps
    args.rounds = rounds if args.rounds is None else args.rounds
    args.batch = args.batch or (128 if resnet else 32)
    args.image_size = args.image_size or (224 if resnet else 32)
    args.amp = args.amp or ("bf16" if resnet and args.device == "cuda" else "none")
    args.channels_last = resnet if args.channels_last is None else args.channels_last
    if args.train:
        train(args)
        return
    plain: list[dict] = []
    doctored: list[dict] = []
    report = None
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            for side in ((False, True) if r % 2 == 0 else (True, False)):
                measured, got = launch(args, side, workdir)
                (doctored if side else plain).append(measured)
                report = got or report
            print(f"round {r + 1}: plain {plain[-1]['seconds'] / args.steps * 1e3:.3f} ms/step, "
                  f"nndoctor run {doctored[-1]['seconds'] / args.steps * 1e3:.3f} ms/step "
                  f"({time.monotonic() - started:.0f} s so far)", flush=True)
    result = summarize(args, plain, doctored, report)
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    print(f"\nthroughput ratio (nndoctor run / plain, {args.rounds} rounds × {args.steps} steps) on "
          f"{args.gpus}× {result['device']}, {args.model}: {result['throughput_ratio']:.4f} "
          f"(rounds {', '.join(f'{x:.3f}' for x in result['per_round_ratios'])}; median of the pair ratios "
          f"{result['median_round_ratio']:.4f}, quartiles {' – '.join(f'{x:.3f}' for x in result['round_ratio_quartiles'][::2])}); "
          f"report ok: {result['report_ok']}, "
          f"internal errors: {result['internal_errors']}")
    paths = [args.json] if args.json else []
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        tag = "".join(c if c.isalnum() else "_" for c in args.nndoctor_args).strip("_")
        paths.append(os.path.join(args.out, f"ddp_overhead_{args.model}_{args.gpus}x{args.device}"
                                  + (f"_{tag}" if tag else "") + ".json"))
    for path in paths:
        with open(path, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
