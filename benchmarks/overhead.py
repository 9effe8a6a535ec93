"""Overhead of `nndoctor run` instrumentation: the same training loop plain and under the doctor.

Rounds alternate plain / doctored (interleaved, so drift in machine load hits both), each
round times steady-state steps after the full-instrumentation window, and the script prints
the median step time of each side and their ratio.

    python benchmarks/overhead.py                       # CPU: small CNN, batch 64
    python benchmarks/overhead.py --device cuda --model resnet50 --amp bf16 \
        --channels-last --batch 128                     # GPU (see benchmarks/README.md)
    python benchmarks/overhead.py --model lm --batch 8 --seq 64 --width 64 --layers 6   # CPU, many small modules
    python benchmarks/overhead.py --device cuda --model lm --amp bf16 --batch 16        # GPU: 6 layers, d=512, seq 512
    python benchmarks/overhead.py --device cuda --model bert --amp bf16 --batch 32      # HF BertForSequenceClassification

``lm`` is the decoder-only transformer of ``perf_patients.py`` (hand-written attention,
tokens made on the device, logits reshaped before the loss); ``bert`` is
``transformers.BertForSequenceClassification`` from a ``BertConfig`` (no download; its loss
computed inside the model from ``labels``).

The doctored side runs every registered runtime check (the default of `nndoctor run`).
``--selections all,M101`` times one doctored side per selection (comma-separated codes, one
selection per ``,``-free item; ``all`` = every check), interleaved with the plain side, and
prints each side's ratio to plain and to the first selection: how much a narrow
``--select`` saves, now that instrumentation installs only what the enabled checks need.

    python benchmarks/overhead.py --selections all,M101 --rounds 7 --clock cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn as nn


def build_model(name: str) -> nn.Module:
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(num_classes=1000)
    if name == "resnet18":
        import torchvision

        return torchvision.models.resnet18(num_classes=10)
    return nn.Sequential(  # "smallcnn": a CPU-sized conv net with BN and dropout
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Dropout(0.2), nn.Linear(128, 10),
    )


def lm_module() -> types.ModuleType:
    """The LM patient's script as a module (its GPT, Block, Attention classes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from perf_patients import LM_SCRIPT

    module = types.ModuleType("lm_patient")
    exec(compile(LM_SCRIPT, "lm_patient.py", "exec"), module.__dict__)  # noqa: S102 - our own source
    return module


def lm_args(args) -> argparse.Namespace:
    return lm_module().parse(["--layers", str(args.layers), "--width", str(args.width), "--heads", str(args.heads),
                              "--seq", str(args.seq), "--vocab", str(args.vocab), "--batch-size", str(args.batch)])


def make_sequence_side(args, device):
    """A transformer's step: the LM (loss after a reshape) or BERT (loss inside the model)."""
    torch.manual_seed(0)
    g = torch.Generator(device="cpu").manual_seed(1)
    if args.model == "lm":
        patient = lm_module()
        model = patient.GPT(lm_args(args)).to(device)
    else:
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(vocab_size=args.vocab, hidden_size=args.width, num_hidden_layers=args.layers,
                            num_attention_heads=args.heads, intermediate_size=4 * args.width,
                            max_position_embeddings=max(512, args.seq), num_labels=2)
        model = BertForSequenceClassification(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = []
    for _ in range(4):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g).to(device)
        labels = torch.randint(0, 2, (args.batch,), generator=g).to(device)
        batches.append((tokens, labels))
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)

    def step(i: int) -> None:
        tokens, labels = batches[i % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            if args.model == "lm":
                logits = model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                   tokens[:, 1:].reshape(-1))
            else:
                loss = model(input_ids=tokens[:, :-1], labels=labels).loss
        loss.backward()
        optimizer.step()

    return step


def make_side(args, device):
    if args.model in ("lm", "bert"):
        return make_sequence_side(args, device)
    torch.manual_seed(0)
    model = build_model(args.model).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    classes = 1000 if args.model == "resnet50" else 10
    size = args.image_size
    g = torch.Generator(device="cpu").manual_seed(1)
    # A few distinct batches, resident on the device: this measures instrumentation, not I/O.
    batches = []
    for _ in range(4):
        x = torch.randn(args.batch, 3, size, size, generator=g).to(device)
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, classes, (args.batch,), generator=g).to(device)
        batches.append((x, y))
    criterion = nn.CrossEntropyLoss()
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()

    return step


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = time.perf_counter


def timed_steps(step, start: int, count: int, device) -> float:
    """Seconds per step over ``count`` steps (one sync at each end, none in between)."""
    sync(device)
    began = clock()
    for i in range(start, start + count):
        step(i)
    sync(device)
    return (clock() - began) / count


def run_round(args, device, doctored: bool, select: list[str] | None = None) -> float:
    import nndoctor
    from nndoctor.core.engine import DEFAULT_FULL_WINDOW

    step = make_side(args, device)
    window = DEFAULT_FULL_WINDOW if doctored else 0
    if doctored:
        with nndoctor.watch(select=select or ()) as report:
            for i in range(max(window, args.warmup)):  # the full-instrumentation window
                step(i)
            per_step = timed_steps(step, max(window, args.warmup), args.steps, device)
        run_round.last_report = report
    else:
        for i in range(args.warmup):
            step(i)
        per_step = timed_steps(step, args.warmup, args.steps, device)
    return per_step


def installed_probes(select: list[str]) -> list[str] | None:
    """What the instrumentation installs for this selection (None on a version without probes)."""
    from nndoctor.core.engine import Session
    from nndoctor.instrument.extensions import install

    installation = install(Session(select=select))
    installation.uninstall()
    probes = getattr(installation, "probes", None)
    return sorted(probes) if probes is not None else None


def add_setup_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, batch and device options (shared with sampled_step_cost.py)."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="smallcnn", choices=["smallcnn", "resnet18", "resnet50", "lm", "bert"])
    parser.add_argument("--layers", type=int, default=6, help="lm / bert")
    parser.add_argument("--width", type=int, default=512, help="lm / bert")
    parser.add_argument("--heads", type=int, default=8, help="lm / bert")
    parser.add_argument("--seq", type=int, default=512, help="lm / bert: tokens per sample")
    parser.add_argument("--vocab", type=int, default=32000, help="lm / bert")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--warmup", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for torch (1 by default: with 2 threads on a 2-core machine, "
                             "thread contention swings step times far more than instrumentation does)")


def setup_device(args: argparse.Namespace) -> torch.device:
    device = torch.device(args.device)
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    return device


def card_name(device: torch.device) -> str:
    return torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_setup_arguments(parser)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100,
                        help="timed steady-state steps per round (at least one sampling period, so "
                             "the sampled steps are in the average)")
    parser.add_argument("--json", help="write the numbers here too")
    parser.add_argument("--selections", default="all",
                        help="doctored sides, comma-separated: 'all' (every check) or a check code / "
                             "prefix each, e.g. 'all,M101' (a side per item, compared with the first)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="cpu: this thread's CPU time (with --device cpu and --threads 1: time other processes "
                             "take from a shared machine is not counted)")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    device = setup_device(args)

    selections = [s.strip() for s in args.selections.split(",") if s.strip()] or ["all"]
    sides = ["plain", *selections]
    times: dict[str, list[float]] = {side: [] for side in sides}
    reports: dict[str, object] = {}
    for r in range(args.rounds):
        # Rotate which side goes first so a slow warm-up or load drift favours none.
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for side in order:
            if side == "plain":
                times[side].append(run_round(args, device, False))
            else:
                times[side].append(run_round(args, device, True, [] if side == "all" else [side]))
                reports[side] = run_round.last_report
        print(f"round {r + 1}: " + ", ".join(f"{side} {times[side][-1] * 1e3:.2f} ms/step" for side in sides),
              flush=True)
    plain = times["plain"]
    doctored = times[selections[0]]
    ratio = statistics.median(doctored) / statistics.median(plain)
    ratios = [d / p for d, p in zip(doctored, plain)]
    card = card_name(device)
    report = reports[selections[0]]
    by_selection = {
        side: {"ms_median": statistics.median(times[side]) * 1e3,
               "ratio_to_plain": statistics.median(times[side]) / statistics.median(plain),
               "ratio_to_first_selection": statistics.median(times[side]) / statistics.median(doctored),
               "per_round_ratios_to_plain": [d / p for d, p in zip(times[side], plain)],
               "probes_installed": installed_probes([] if side == "all" else [side])}
        for side in selections
    }
    result = {
        "device": card, "model": args.model, "batch": args.batch, "amp": args.amp,
        "channels_last": args.channels_last, "rounds": args.rounds, "steps_per_round": args.steps,
        "clock": args.clock,
        "plain_ms_median": statistics.median(plain) * 1e3,
        "nndoctor_ms_median": statistics.median(doctored) * 1e3,
        "ratio_of_medians": ratio, "per_round_ratios": ratios,
        "checks_findings": sorted(report.codes()), "internal_errors": len(report.internal_errors),
        "torch": torch.__version__, "selections": by_selection,
    }
    print(json.dumps(result, indent=2))
    print(f"\nsteady-state overhead ratio (median nndoctor / median plain) on {card}: {ratio:.3f}")
    for side in selections[1:]:
        print(f"--select {side} vs {selections[0]}: {by_selection[side]['ratio_to_first_selection']:.3f} "
              f"(to plain: {by_selection[side]['ratio_to_plain']:.3f})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
