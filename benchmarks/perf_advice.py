"""Does `nndoctor perf`'s advice pay off? Baseline, advised and best-of-sweep on a real GPU.

Steps (run on the device H100; nothing is left behind — everything lives in a temp dir):

1. generate >= 5,000 photo-like JPEGs (smooth colour fields, edges and sensor noise, 10
   class folders, ~400x300, quality 90);
2. write a deliberately naive ResNet-50 training script (fp32, NCHW, num_workers=0,
   ``.item()`` every step, PIL decoding through torchvision ImageFolder) and measure its
   images/s — the baseline;
3. run ``nndoctor perf --try loader,amp,channels_last,cudnn-benchmark`` on it and turn the
   JSON ``advice`` list into command-line flags of the same script, mechanically;
4. measure the advised configuration;
5. sweep the combinations of the options (``--phase final``, see ``SWEEP``) with the advised
   configuration measured by the same harness, and re-measure baseline and advised;
6. overhead: the script's own images/s under plain python, ``nndoctor run`` and
   ``nndoctor perf``, interleaved repeats, GPU-bound (fixed batch) and loader-bound.

    python benchmarks/perf_advice.py --phase main  --out $OUT                 # steps 1-4
    python benchmarks/perf_advice.py --phase final --advised-flags "..." --out $OUT   # 1, 5, 6
    python benchmarks/perf_advice.py --phase verify --advised-flags "..." --out $OUT  # 5 again, one process each
    python benchmarks/perf_advice.py --phase overhead --advised-flags "..." --out $OUT  # 6 alone

Every images/s number in this file's output comes from the same in-script timing: the
device is synchronised after the warm-up steps and after the measured steps.

Two more patients, each one command (``perf_patients.py``: the scripts, the grids, the advice
mapping): a decoder-only transformer LM and a launch-bound small MLP.

    python benchmarks/perf_advice.py --patient lm  --out $OUT
    python benchmarks/perf_advice.py --patient mlp --out $OUT
    python benchmarks/perf_advice.py --patient lm --tiny --out /tmp/smoke    # CPU smoke test

Issue 29's patient, a nanoGPT-style decoder as tutorials write it (hand-written attention,
AdamW without foreach/fused kernels, fp32, loss.item() every step), in ONE command: ``nndoctor
perf --try all`` with the default budget, the grid (bf16 × SDPA × fused AdamW, TF32, and
torch.compile on the best corner), the advice and the grid's best point re-measured fresh and
interleaved; the JSON's ``headline`` has perf's wall time, the advised combination and
advised / fresh best (the issue asks ≥ 0.90):

    python benchmarks/perf_advice.py --patient decoder --out $OUT/decoder.json
    python benchmarks/perf_advice.py --patient decoder --tiny --out /tmp/smoke/decoder.json  # CPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TRAIN_SCRIPT = r'''
"""Naive ResNet-50 training on a folder of JPEGs (the patient of benchmarks/perf_advice.py)."""
import argparse
import time

import torch
import torch.nn as nn
import torchvision
from torchvision import transforms


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--pin", action="store_true")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--prefetch", type=int, default=None)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--cudnn-benchmark", action="store_true")
    p.add_argument("--sync-every", type=int, default=1, help="read the loss with .item() every N steps")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--tf32", action="store_true", help="TF32 matmuls and convolutions")
    p.add_argument("--fused", action="store_true", help="SGD(fused=True)")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="measured steps after the warm-up")
    p.add_argument("--synthetic", action="store_true", help="one fixed batch on the GPU, no loading")
    return p.parse_args(argv)


def build_loader(args):
    transform = transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    dataset = torchvision.datasets.ImageFolder(args.data, transform=transform)
    kwargs = {}
    if args.workers:
        kwargs["persistent_workers"] = args.persistent
        if args.prefetch:
            kwargs["prefetch_factor"] = args.prefetch
    return torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                       num_workers=args.workers, pin_memory=args.pin, **kwargs)


def build_model(args):
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = torchvision.models.resnet50(num_classes=10).cuda()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                                **({"fused": True} if args.fused else {}))
    step_model = torch.compile(model) if args.compile else model
    return model, step_model, optimizer


def batches(loader):
    while True:
        for batch in loader:
            yield batch


def warmup_steps(args):
    """Worker processes fill num_workers * prefetch_factor batches while the model is built;
    the clock starts once those are consumed, or it would time batches loaded before it."""
    return args.warmup_steps + (args.workers * (args.prefetch or 2) if args.workers else 0)


def train(args, loader, model, step_model, optimizer, criterion):
    """Returns images/s over the measured steps (device synchronised at both ends)."""
    if args.synthetic:
        fixed = (torch.randn(args.batch_size, 3, 224, 224), torch.randint(0, 10, (args.batch_size,)))
        stream = iter(lambda: fixed, None)
    else:
        stream = batches(loader)
    warmup = warmup_steps(args)
    running, started, seen = 0.0, None, 0
    for step in range(warmup + args.steps):
        if step == warmup:
            torch.cuda.synchronize()
            started, seen = time.perf_counter(), 0
        images, labels = next(stream)
        images = images.cuda(non_blocking=args.pin)
        labels = labels.cuda(non_blocking=args.pin)
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp):
            loss = criterion(step_model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        seen += images.shape[0]
        if args.sync_every and (step + 1) % args.sync_every == 0:
            running += loss.item()
    torch.cuda.synchronize()
    return seen / (time.perf_counter() - started)


def main():
    args = parse()
    loader = None if args.synthetic else build_loader(args)
    model, step_model, optimizer = build_model(args)
    rate = train(args, loader, model, step_model, optimizer, nn.CrossEntropyLoss())
    print(f"IMAGES_PER_S {rate:.1f}", flush=True)


if __name__ == "__main__":
    main()
'''


# -- data ---------------------------------------------------------------------------------------
def _photo(index: int) -> object:
    """A photo-like image: smooth illumination, blobs and edges at several scales, grain."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(index)
    width, height = int(rng.integers(360, 480)), int(rng.integers(280, 360))
    image = np.zeros((height, width, 3), dtype=np.float32)
    for cells, weight in ((3, 120.0), (12, 50.0), (48, 20.0)):
        field = rng.random((cells, max(2, cells * width // height), 3)).astype(np.float32)
        up = Image.fromarray((field * 255).astype(np.uint8)).resize((width, height), Image.BICUBIC)
        image += weight * (np.asarray(up, dtype=np.float32) / 255.0)
    yy, xx = np.mgrid[0:height, 0:width]
    image += 40.0 * ((xx * rng.uniform(-1, 1) + yy * rng.uniform(-1, 1)) > rng.uniform(-100, 300))[..., None]
    image += rng.normal(0, 6, image.shape)
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))


def _write_one(args: tuple[int, str]) -> None:
    index, root = args
    folder = Path(root) / f"class_{index % 10}"
    _photo(index).save(folder / f"img_{index:05d}.jpg", quality=90)


def make_dataset(root: Path, count: int) -> float:
    from multiprocessing import Pool

    for c in range(10):
        (root / f"class_{c}").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with Pool(os.cpu_count()) as pool:
        pool.map(_write_one, [(i, str(root)) for i in range(count)], chunksize=32)
    return time.perf_counter() - started


# -- runs ---------------------------------------------------------------------------------------
def run_script(work: Path, flags: list[str], *, under_perf: list[str] | None = None, timeout: int = 300,
               nndoctor: list[str] | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable]
    if under_perf is not None:
        command += ["-m", "nndoctor", "perf", *under_perf]
    elif nndoctor is not None:
        command += ["-m", "nndoctor", *nndoctor]
    command += [str(work / "train.py"), "--data", str(work / "data"), *flags]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    rate = None
    for line in done.stdout.splitlines():
        if line.startswith("IMAGES_PER_S"):
            rate = float(line.split()[1])
    return {"command": command[1:], "rc": done.returncode, "images_per_s": rate,
            "seconds": time.perf_counter() - started, "stderr_tail": done.stderr[-3000:], "stderr": done.stderr}


def advice_to_flags(advice: list[dict]) -> list[str]:
    """The perf JSON's advice list as the training script's flags — no judgment involved."""
    flags: list[str] = []
    for item in advice:
        change = item["change"]
        if change == "loader":
            flags += ["--workers", str(item["num_workers"])]
            if item.get("pin_memory"):
                flags.append("--pin")
            if item.get("persistent_workers"):
                flags.append("--persistent")
            if item.get("prefetch_factor") and item["num_workers"]:
                flags += ["--prefetch", str(item["prefetch_factor"])]
        elif change == "fewer-syncs":
            flags += ["--sync-every", "100"]
        elif change == "amp":
            flags.append("--amp")
        elif change == "channels_last":
            flags.append("--channels-last")
        elif change == "cudnn-benchmark":
            flags.append("--cudnn-benchmark")
        elif change == "compile":
            flags.append("--compile")
        elif change == "tf32":
            flags.append("--tf32")
        elif change == "fused-optimizer":
            flags.append("--fused")
        elif change == "batch-size":
            flags += ["--batch-size", str(item["batch_size"])]
        elif change != "combination":
            raise SystemExit(f"advice {change!r} has no flag in the image patient: add one")
    return flags


# The best points of the 24-point grid measured on 2026-11-26 (phase verify), and what `--try
# all` can add to them: the fresh, interleaved comparison of phase budget.
BEST_CANDIDATES = (
    "--workers 12 --pin --persistent --prefetch 2 --sync-every 100 --amp --channels-last",
    "--workers 12 --pin --persistent --prefetch 2 --sync-every 100 --amp --channels-last --cudnn-benchmark",
    "--workers 12 --pin --persistent --prefetch 2 --sync-every 100 --amp --channels-last --compile",
    "--workers 12 --pin --persistent --prefetch 2 --sync-every 100 --amp --channels-last --fused --tf32",
)


def phase_budget(work: Path, out: Path, args: argparse.Namespace) -> dict:
    """Issue 29: `nndoctor perf --try all` at its default budget (nothing else on its command
    line), the advice applied mechanically, then advised vs the best candidates, interleaved,
    each a fresh process, `--confirm-repeats` rounds (median per configuration). `--stage perf`
    stops after the perf run; `--advised-flags` skips it (two device calls of < 10 min)."""
    import torch

    results: dict = {"card": torch.cuda.get_device_name(0), "cpus": os.cpu_count(), "images": args.images}
    measure = ["--warmup-steps", "5", "--steps", str(args.steps)]
    if args.advised_flags:  # the perf run was an earlier call (--stage perf): measure only
        return _budget_confirm(work, out, args, results, args.advised_flags.split(), measure)
    perf_json = work / "perf.json"
    perf_run = run_script(work, ["--steps", "100000"], under_perf=["--try", "all", "--json", str(perf_json)],
                          timeout=900)
    results["perf_run"] = {k: perf_run[k] for k in ("command", "rc", "seconds")}
    (out / "perf_terminal_budget.txt").write_text(perf_run["stderr"])
    print(f"perf --try all: rc {perf_run['rc']}, {perf_run['seconds']:.0f} s", flush=True)
    report = json.loads(perf_json.read_text())
    shutil.copy(perf_json, out / "perf_report_budget.json")
    perf = report["extra"]["perf"]
    trials = perf.get("trials") or {}
    results["budget"] = trials.get("budget")
    results["trials"] = {name: {k: t.get(k) for k in ("speedup", "measure", "not_measured", "skipped", "reason",
                                                      "predicted")}
                         for name, t in trials.items() if isinstance(t, dict) and name != "budget"}
    results["advice"] = perf["advice"]
    results["captured_step"] = trials.get("captured_step")
    for line in _captured_step_lines(trials.get("captured_step")):
        print(line, flush=True)
    print("advice (perf's JSON, applied mechanically below):", flush=True)
    for item in perf["advice"]:
        print("  " + json.dumps(item, default=str), flush=True)
    flags = advice_to_flags(perf["advice"])
    results["advised_flags"] = " ".join(flags)
    print("advised flags", flags, flush=True)
    (out / "perf_advice_budget.json").write_text(json.dumps(results, indent=1, default=str))
    if args.stage == "perf":
        return results
    return _budget_confirm(work, out, args, results, flags, measure)


def _captured_step_lines(captured: dict | None) -> list[str]:
    """Issue 29, input-bound loop: the step changes perf timed on the captured batch (compute
    only), their combination, and the winners' end-to-end timing at the loader's best setting."""
    if not captured:
        return ["captured batch: no step change was timed there (the loop was not input-bound, or no step "
                "could be rebuilt)"]
    lines = [f"captured batch ({captured.get('repeats')} interleaved rounds of {captured.get('steps')} steps):"]
    for name, verdict in (captured.get("changes") or {}).items():
        if "speedup" in verdict:
            lines.append(f"  {name}: {verdict['speedup']:.2f}× (noise {verdict['noise']:.1%}, loss change "
                         f"{verdict['loss_change']:.2%}, {'faster' if verdict['pays_off'] else 'no gain'})")
        else:
            lines.append(f"  {name}: {verdict.get('error') or verdict.get('not_measured')}")
    together = captured.get("together") or {}
    if together.get("speedup"):
        lines.append(f"  together {' + '.join(together['changes'])}: {together['speedup']:.2f}×")
    e2e = captured.get("end_to_end") or {}
    if e2e.get("speedup"):
        lines.append(f"  winners {captured.get('winners')} end to end at {e2e['setting']}: "
                     f"{e2e['baseline_samples_per_s']:.0f} → {e2e['variant_samples_per_s']:.0f} samples/s, "
                     f"{e2e['speedup']:.2f}× (noise {e2e['noise']:.1%})")
    elif e2e:
        lines.append(f"  winners {captured.get('winners')} end to end: {e2e.get('not_measured') or e2e.get('error')}")
    lines.append(f"  advised: {captured.get('advice')}")
    return lines


def _budget_confirm(work: Path, out: Path, args: argparse.Namespace, results: dict, flags: list[str],
                    measure: list[str]) -> dict:
    import statistics

    configs = {"advised": flags, **{f"candidate {i}": c.split() for i, c in enumerate(BEST_CANDIDATES)}}
    rows: dict[str, list[float]] = {name: [] for name in ["baseline", *configs]}
    rows["baseline"].append(run_script(work, measure)["images_per_s"])
    for round_ in range(args.confirm_repeats):
        order = list(configs.items())
        if round_ % 2:
            order.reverse()
        for name, config in order:
            rate = run_script(work, measure + config)["images_per_s"]
            rows[name].append(rate)
            print(round_, name, rate, flush=True)
        (out / "perf_advice_budget_confirm.json").write_text(json.dumps({**results, "rows": rows}, indent=1,
                                                                       default=str))
    medians = {name: statistics.median(v) for name, v in rows.items() if v and None not in v}
    best = max((n for n in medians if n != "baseline"), key=medians.get)
    results.update(rows=rows, medians=medians, best=best,
                   configs={name: " ".join(c) for name, c in configs.items()},
                   advised_over_best=medians["advised"] / medians[best],
                   advised_over_baseline=medians["advised"] / medians["baseline"])
    print(json.dumps({k: results[k] for k in ("medians", "best", "advised_over_best", "advised_over_baseline")}),
          flush=True)
    return results


def phase_main(work: Path, out: Path, args: argparse.Namespace) -> dict:
    import torch

    results: dict = {"card": torch.cuda.get_device_name(0), "cpus": os.cpu_count(), "images": args.images}
    measure = ["--warmup-steps", "5", "--steps", str(args.steps)]
    results["baseline"] = run_script(work, measure)
    results["baseline"].pop("stderr")
    print("baseline", results["baseline"]["images_per_s"], flush=True)

    perf_json = work / "perf.json"
    perf_args = ["--warmup", "5", "--steps", "15", "--try", "loader,amp,channels_last,cudnn-benchmark",
                 "--try-seconds", "3", "--json", str(perf_json)]
    perf_run = run_script(work, ["--steps", "100000"], under_perf=perf_args, timeout=500)
    results["perf_run"] = {k: perf_run[k] for k in ("command", "rc", "seconds")}
    report = json.loads(perf_json.read_text())
    shutil.copy(perf_json, out / "perf_report.json")
    (out / "perf_terminal.txt").write_text(perf_run["stderr"])
    advice = report["extra"]["perf"]["advice"]
    loader_trial = report["extra"]["perf"]["trials"].get("loader") or {}
    results["loader_trial"] = {k: loader_trial.get(k) for k in ("measure", "confirmed", "confirm_error", "speedup")}
    for row in loader_trial.get("confirmed") or []:
        print("end to end", {k: row.get(k) for k in ("num_workers", "pin_memory", "prefetch_factor",
                                                     "samples_per_s", "rounds_samples_per_s")}, flush=True)
    flags = advice_to_flags(advice)
    results["advice"], results["advised_flags"] = advice, flags
    results["findings"] = [f"{f['code']} {f['severity']}: {f['message']}" for f in report["findings"]]
    print("advised flags", flags, flush=True)
    results["advised"] = run_script(work, measure + flags)
    results["advised"].pop("stderr")
    print("advised", results["advised"]["images_per_s"], flush=True)
    # Configurations to compare with the advice in the same run (e.g. the best grid point of
    # an earlier sweep), so advised/best is a same-machine, same-data ratio.
    results["also"] = {}
    for extra in filter(None, (f.strip() for f in args.also.split(";"))):
        run = run_script(work, measure + extra.split())
        run.pop("stderr")
        results["also"][extra] = run
        print("also", extra, run["images_per_s"], flush=True)
    return results


VERIFY = {  # fresh process per configuration (no loader or worker reused between configurations)
    "workers": (8, 12, 16),
    "pin": (False, True),
    "amp_channels_last": (False, True),
    "sync_every": (1, 100),
}


def phase_verify(work: Path, out: Path, args: argparse.Namespace) -> dict:
    """Every configuration in its own process with a long window, like baseline and advised."""
    measure = ["--warmup-steps", "5", "--steps", str(args.steps)]
    results: dict = {"rows": []}

    def one(label: str, flags: list[str]) -> None:
        run = run_script(work, measure + flags)
        results["rows"].append({"label": label, "flags": flags, "images_per_s": run["images_per_s"]})
        print(json.dumps(results["rows"][-1]), flush=True)
        (out / "perf_advice_verify.json").write_text(json.dumps(results, indent=1))

    advised = args.advised_flags.split()
    one("baseline", ["--steps", "20"])
    one("advised", advised)
    for workers, pin, fast, sync in itertools.product(*VERIFY.values()):
        flags = ["--workers", str(workers), "--persistent", "--sync-every", str(sync)]
        flags += (["--pin"] if pin else []) + (["--amp", "--channels-last"] if fast else [])
        one("grid", flags)
    one("advised", advised)
    one("baseline", ["--steps", "20"])
    return results


SWEEP = {
    "workers": (8, 16),
    "pin": (False, True),
    "amp": (False, True),
    "channels_last": (False, True),
    "cudnn_benchmark": (False, True),
    "sync_every": (1, 100),
}


def phase_sweep(work: Path, out: Path, args: argparse.Namespace) -> dict:
    """All combinations of SWEEP in one process: one persistent loader per loader setting."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("naive_train", work / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    rows = []

    def measure(flags: list[str], label: str) -> None:
        cfg = train.parse(["--data", str(work / "data"), "--warmup-steps", "3", "--steps", str(args.sweep_steps),
                           *flags])
        loader = train.build_loader(cfg)
        torch.manual_seed(0)
        model, step_model, optimizer = train.build_model(cfg)
        rate = train.train(cfg, loader, model, step_model, optimizer, torch.nn.CrossEntropyLoss())
        rows.append({"label": label, "flags": flags, "images_per_s": rate})
        print(json.dumps(rows[-1]), flush=True)
        del loader, model, step_model, optimizer

    # num_workers=0 is data-bound at any GPU setting: its two extremes only.
    measure([], "workers=0, naive")
    measure(["--amp", "--channels-last", "--cudnn-benchmark", "--sync-every", "100"], "workers=0, all GPU options")
    if args.advised_flags:
        measure(args.advised_flags.split(), "advised by nndoctor perf")
    for workers, pin in itertools.product(SWEEP["workers"], SWEEP["pin"]):
        base = train.parse(["--data", str(work / "data"), "--workers", str(workers), "--warmup-steps", "3",
                            "--steps", str(args.sweep_steps)] + (["--pin"] if pin else [])
                           + (["--persistent"] if workers else []))
        loader = train.build_loader(base)
        for amp, cl, bench, sync in itertools.product(SWEEP["amp"], SWEEP["channels_last"],
                                                      SWEEP["cudnn_benchmark"], SWEEP["sync_every"]):
            cfg = argparse.Namespace(**{**vars(base), "amp": amp, "channels_last": cl,
                                        "cudnn_benchmark": bench, "sync_every": sync})
            torch.manual_seed(0)
            model, step_model, optimizer = train.build_model(cfg)
            rate = train.train(cfg, loader, model, step_model, optimizer, torch.nn.CrossEntropyLoss())
            row = {"label": "sweep", "workers": workers, "pin": pin, "amp": amp, "channels_last": cl,
                   "cudnn_benchmark": bench, "sync_every": sync, "images_per_s": rate}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del model, step_model, optimizer
        del loader
    best = max((r for r in rows if r["label"] == "sweep"), key=lambda r: r["images_per_s"])
    results = {"card": torch.cuda.get_device_name(0), "rows": rows, "best": best}
    (out / "perf_advice_sweep.json").write_text(json.dumps(results, indent=1, default=str))
    return results


def phase_overhead(work: Path, out: Path, args: argparse.Namespace) -> dict:
    """The script's own images/s: plain python, `nndoctor run`, `nndoctor perf` (every step in the
    measured window), interleaved; a GPU-bound case (fixed batch) and the advised loader case."""
    cases = {"gpu_bound": ["--synthetic", "--amp", "--channels-last", "--sync-every", "100"],
             "advised": (args.advised_flags or "").split()}
    modes = {"plain": None, "perf": ["perf", "--warmup", "0", "--steps", "100000"]}
    results: dict = {}
    for case, flags in cases.items():
        results[case] = {mode: [] for mode in modes}
        for repeat in range(args.overhead_repeats):
            order = list(modes.items())
            for mode, prefix in (order if repeat % 2 == 0 else order[::-1]):  # neither side always first
                run = run_script(work, ["--warmup-steps", "5", "--steps", "60", *flags], nndoctor=prefix)
                results[case][mode].append(run["images_per_s"])
        print("overhead", case, json.dumps(results[case]), flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patient", choices=("resnet50", "lm", "mlp", "decoder"), default="resnet50",
                        help="lm / mlp / decoder: the whole benchmark of that patient in one run (perf_patients.py)")
    parser.add_argument("--tiny", action="store_true", help="lm / mlp / decoder: CPU-sized smoke test")
    parser.add_argument("--try-repeats", type=int, default=None,
                        help="lm / mlp: nndoctor perf --try-repeats (default 2; decoder: nndoctor's default, 3)")
    parser.add_argument("--perf-timeout", type=int, default=560, help="lm / mlp: seconds for the nndoctor perf run")
    parser.add_argument("--stage", choices=("perf", "grid", "all", "confirm"), default="all",
                        help="lm / mlp: nndoctor perf only, the timed grid only (with --perf-report), or both; "
                             "confirm: re-measure the advised flags and the grid's best points (--grid-result)")
    parser.add_argument("--grid-result", help="--stage confirm: the perf_advice_<patient>_grid.json of --stage grid")
    parser.add_argument("--confirm-top", type=int, default=None,
                        help="--stage confirm (and decoder): the grid's best points re-measured (default 3; decoder 1)")
    parser.add_argument("--confirm-repeats", type=int, default=None,
                        help="--stage confirm (and decoder): interleaved rounds (default 5; decoder 2)")
    parser.add_argument("--perf-report", help="lm / mlp --stage grid: the perf_<patient>_report.json of --stage perf")
    parser.add_argument("--grid-repeats", type=int, default=None,
                        help="lm / mlp / decoder: rounds over naive, advised and the grid (median per configuration; "
                             "default 3, decoder 1: its best point is re-measured fresh afterwards)")
    parser.add_argument("--phase", choices=("main", "final", "verify", "overhead", "budget"),
                        help="resnet50: which part of its benchmark to run")
    parser.add_argument("--advised-flags", default="", help="final: the flags the main phase derived from the advice")
    parser.add_argument("--out", default=".", help="a folder, or (decoder) the JSON file to write")
    parser.add_argument("--also", default="", help="main: extra flag sets to measure after the advised one, ';'-separated")
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--steps", type=int, default=30, help="measured steps of baseline/advised runs")
    parser.add_argument("--sweep-steps", type=int, default=10)
    parser.add_argument("--overhead-repeats", type=int, default=2)
    args = parser.parse_args()
    decoder = args.patient == "decoder"
    for name, usual, for_decoder in (("try_repeats", 2, 3), ("confirm_top", 3, 1), ("confirm_repeats", 5, 2),
                                     ("grid_repeats", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, for_decoder if decoder else usual)
    out_file = Path(args.out) if args.out.endswith(".json") else None
    out = out_file.parent if out_file else Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="nndoctor_perf_bench_"))
    if args.patient != "resnet50":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from perf_patients import confirm, run_decoder, run_patient

        try:
            if args.stage == "confirm":
                results = confirm(args, out, work)
            else:
                results = (run_decoder if decoder else run_patient)(args, out, work)
            suffix = ("_tiny" if args.tiny else "") + ("" if args.stage == "all" else f"_{args.stage}")
            (out_file or out / f"perf_advice_{args.patient}{suffix}.json").write_text(
                json.dumps(results, indent=1, default=str))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    if args.phase is None:
        parser.error("--phase is required for --patient resnet50")
    try:
        (work / "train.py").write_text(TRAIN_SCRIPT)
        seconds = make_dataset(work / "data", args.images)
        print(f"dataset: {args.images} JPEGs in {seconds:.1f} s", flush=True)
        if args.phase == "main":
            results = phase_main(work, out, args)
        elif args.phase == "budget":
            results = phase_budget(work, out, args)
        elif args.phase == "verify":
            results = phase_verify(work, out, args)
        elif args.phase == "overhead":
            results = {"overhead": phase_overhead(work, out, args)}
        else:  # the sweep (with the advised row), standalone baseline/advised, then the overhead
            results = {"sweep": phase_sweep(work, out, args)}
            measure = ["--warmup-steps", "5", "--steps", str(args.steps)]
            for name, flags in (("baseline", []), ("advised", args.advised_flags.split())):
                results[name] = run_script(work, measure + flags)
                results[name].pop("stderr")
                print(name, results[name]["images_per_s"], flush=True)
            (out / "perf_advice_final.json").write_text(json.dumps(results, indent=1, default=str))
            results["overhead"] = phase_overhead(work, out, args)
        results["dataset_s"] = seconds
        (out / f"perf_advice_{args.phase}.json").write_text(json.dumps(results, indent=1, default=str))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
