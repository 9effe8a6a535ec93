"""Two more patients for ``benchmarks/perf_advice.py``: a decoder-only transformer LM and a
launch-bound small MLP. For each, in one command:

1. write the naive training script (``LM_SCRIPT`` / ``MLP_SCRIPT``) into a temp dir;
2. run ``nndoctor perf --try <the changes that concern it>`` on it and turn the JSON ``advice``
   into the script's flags mechanically (``advice_to_flags``);
3. time, in one process, each with a fresh model: naive, advised, every point of the grid
   (``LM_GRID`` / ``MLP_GRID``), then naive and advised again (interleaved ends: drift hits
   both); samples/s from the script's own timing (device synchronised at both ends);
4. report advised/naive, best/naive and advised/best.

    python benchmarks/perf_advice.py --patient lm  --out $OUT     # H100: ~6 min (estimated, not run)
    python benchmarks/perf_advice.py --patient mlp --out $OUT     # H100: ~6 min (estimated, not run)
    python benchmarks/perf_advice.py --patient lm  --tiny --out /tmp/smoke   # CPU smoke test
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LM_SCRIPT = r'''
"""Naive decoder-only LM training (a patient of benchmarks/perf_advice.py): fp32, attention
written out by hand, tokens made on the device, logits reshaped before the loss, AdamW
(foreach), loss.item() every step."""
import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--lr-scale", type=float, default=1.0)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--sdpa", action="store_true", help="F.scaled_dot_product_attention instead of the hand-written one")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-mode", default=None)
    p.add_argument("--fused", action="store_true", help="AdamW(fused=True)")
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--sync-every", type=int, default=1, help="read the loss with .item() every N steps")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    return p.parse_args(argv)


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.heads, self.sdpa = args.heads, args.sdpa
        self.qkv = nn.Linear(args.width, 3 * args.width)
        self.proj = nn.Linear(args.width, args.width)
        self.register_buffer("mask", torch.tril(torch.ones(args.seq, args.seq)).view(1, 1, args.seq, args.seq))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(args.width), nn.LayerNorm(args.width)
        self.attn = Attention(args)
        self.mlp = nn.Sequential(nn.Linear(args.width, 4 * args.width), nn.GELU(), nn.Linear(4 * args.width, args.width))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.tokens = nn.Embedding(args.vocab, args.width)
        self.positions = nn.Parameter(torch.zeros(1, args.seq, args.width))
        self.blocks = nn.Sequential(*(Block(args) for _ in range(args.layers)))
        self.norm = nn.LayerNorm(args.width)
        self.head = nn.Linear(args.width, args.vocab, bias=False)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions[:, : idx.shape[1]]
        return self.head(self.norm(self.blocks(x)))


def build(args):
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.manual_seed(0)
    model = GPT(args).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr * args.lr_scale, fused=True if args.fused else None)
    step_model = model
    if args.compile or args.compile_mode:
        step_model = torch.compile(model, mode=args.compile_mode)
    return model, step_model, optimizer


def sync(args):
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def train(args, model, step_model, optimizer):
    """Samples/s over the measured steps (device synchronised at both ends)."""
    running, started = 0.0, None
    for step in range(args.warmup_steps + args.steps):
        if step == args.warmup_steps:
            sync(args)
            started = time.perf_counter()
        batch = torch.randint(0, args.vocab, (args.batch_size, args.seq + 1), device=args.device)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        with torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.amp):
            logits = step_model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.sync_every and (step + 1) % args.sync_every == 0:
            running += loss.item()
    sync(args)
    return args.batch_size * args.steps / (time.perf_counter() - started)


def main():
    args = parse()
    rate = train(args, *build(args))
    print(f"SAMPLES_PER_S {rate:.2f}", flush=True)
    print(f"TOKENS_PER_S {rate * args.seq:.0f}", flush=True)


if __name__ == "__main__":
    main()
'''

MLP_SCRIPT = r'''
"""Naive small-MLP training (a patient of benchmarks/perf_advice.py): the data on the device,
batches of 32 indexed through a DataLoader over a BatchSampler, Adam (foreach), loss.item()
every step — every step is a few dozen tiny kernels: the host's launches bound it."""
import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=65536)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-scale", type=float, default=1.0)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-mode", default=None, help="reduce-overhead: CUDA graphs")
    p.add_argument("--fused", action="store_true", help="Adam(fused=True)")
    p.add_argument("--sync-every", type=int, default=1, help="read the loss with .item() every N steps")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--steps", type=int, default=300)
    return p.parse_args(argv)


def build_loader(args):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, args.features, generator=g).to(args.device)
    y = torch.randint(0, args.classes, (args.samples,), generator=g).to(args.device)
    dataset = TensorDataset(x, y)
    # Whole batches indexed at once (dataset[list_of_indices]), no per-sample collation.
    sampler = BatchSampler(RandomSampler(dataset, generator=torch.Generator().manual_seed(1)),
                           batch_size=args.batch_size, drop_last=True)
    return DataLoader(dataset, sampler=sampler, batch_size=None)


def build(args):
    torch.manual_seed(0)
    layers, width = [], args.features
    for _ in range(args.depth):
        layers += [nn.Linear(width, args.hidden), nn.ReLU()]
        width = args.hidden
    model = nn.Sequential(*layers, nn.Linear(width, args.classes)).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * args.lr_scale, fused=True if args.fused else None)
    step_model = model
    if args.compile or args.compile_mode:
        step_model = torch.compile(model, mode=args.compile_mode)
    return model, step_model, optimizer


def batches(loader):
    while True:
        yield from loader


def sync(args):
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def train(args, loader, model, step_model, optimizer):
    """Samples/s over the measured steps (device synchronised at both ends)."""
    stream = batches(loader)
    running, started, seen = 0.0, None, 0
    for step in range(args.warmup_steps + args.steps):
        if step == args.warmup_steps:
            sync(args)
            started, seen = time.perf_counter(), 0
        x, y = next(stream)
        with torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.amp):
            loss = F.cross_entropy(step_model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        seen += x.shape[0]
        if args.sync_every and (step + 1) % args.sync_every == 0:
            running += loss.item()
    sync(args)
    return seen / (time.perf_counter() - started)


def main():
    args = parse()
    rate = train(args, build_loader(args), *build(args))
    print(f"SAMPLES_PER_S {rate:.2f}", flush=True)


if __name__ == "__main__":
    main()
'''

DECODER_SCRIPT = r'''
"""A nanoGPT-style decoder written the way tutorials write it (the patient of issue 29 in
benchmarks/perf_advice.py): 8 layers, d 768, 12 heads, sequence 512, batch 16, vocab 16k,
hand-written causal attention (softmax(q kᵀ / √d) with a mask), GELU MLP, tied embeddings,
AdamW with neither foreach nor fused kernels, fp32, gradient clipping, loss.item() every step.
Every size is a flag, so the CPU smoke test runs it tiny."""
import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--lr-scale", type=float, default=1.0)
    p.add_argument("--amp", action="store_true", help="bf16 autocast")
    p.add_argument("--sdpa", action="store_true", help="F.scaled_dot_product_attention(is_causal=True)")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-mode", default=None)
    p.add_argument("--fused", action="store_true", help="AdamW(fused=True)")
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--sync-every", type=int, default=1, help="read the loss with .item() every N steps")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    return p.parse_args(argv)


class CausalSelfAttention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.heads, self.sdpa = args.heads, args.sdpa
        self.c_attn = nn.Linear(args.width, 3 * args.width)
        self.c_proj = nn.Linear(args.width, args.width)
        self.register_buffer("bias", torch.tril(torch.ones(args.seq, args.seq)).view(1, 1, args.seq, args.seq))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(args.width), nn.LayerNorm(args.width)
        self.attn = CausalSelfAttention(args)
        self.mlp = nn.Sequential(nn.Linear(args.width, 4 * args.width), nn.GELU(),
                                 nn.Linear(4 * args.width, args.width))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.wte = nn.Embedding(args.vocab, args.width)
        self.wpe = nn.Embedding(args.seq, args.width)
        self.h = nn.ModuleList(Block(args) for _ in range(args.layers))
        self.ln_f = nn.LayerNorm(args.width)
        self.lm_head = nn.Linear(args.width, args.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def forward(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build(args):
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    model = GPT(args).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr * args.lr_scale, weight_decay=0.1,
                                  foreach=False, fused=args.fused)
    step_model = model
    if args.compile or args.compile_mode:
        step_model = torch.compile(model, mode=args.compile_mode)
    return model, step_model, optimizer


def sync(args):
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def train(args, model, step_model, optimizer):
    """Samples/s over the measured steps (device synchronised at both ends)."""
    running, started = 0.0, None
    for step in range(args.warmup_steps + args.steps):
        if step == args.warmup_steps:
            sync(args)
            started = time.perf_counter()
        batch = torch.randint(0, args.vocab, (args.batch_size, args.seq + 1), device=args.device)
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.amp):
            logits = step_model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if args.sync_every and (step + 1) % args.sync_every == 0:
            running += loss.item()
    sync(args)
    return args.batch_size * args.steps / (time.perf_counter() - started)


def main():
    args = parse()
    rate = train(args, *build(args))
    print(f"SAMPLES_PER_S {rate:.2f}", flush=True)
    print(f"TOKENS_PER_S {rate * args.seq:.0f}", flush=True)


if __name__ == "__main__":
    main()
'''

SCRIPTS = {"lm": LM_SCRIPT, "mlp": MLP_SCRIPT, "decoder": DECODER_SCRIPT}

TINY = {  # CPU smoke-test sizes
    "lm": ["--device", "cpu", "--layers", "2", "--width", "32", "--heads", "4", "--seq", "32", "--vocab", "128",
           "--batch-size", "4", "--warmup-steps", "2", "--steps", "4"],
    "mlp": ["--device", "cpu", "--samples", "4096", "--hidden", "64", "--warmup-steps", "5", "--steps", "40"],
    "decoder": ["--device", "cpu", "--layers", "2", "--width", "32", "--heads", "4", "--seq", "32", "--vocab", "128",
                "--batch-size", "4", "--warmup-steps", "2", "--steps", "4"],
}
FULL = {
    "lm": ["--warmup-steps", "5", "--steps", "20"],
    "mlp": ["--warmup-steps", "20", "--steps", "800"],  # ≥ 1 s a point even at batch 256
    "decoder": ["--warmup-steps", "3", "--steps", "15"],  # ~1.6 s a point at the naive ~106 ms a step
}
# What `nndoctor perf --try` measures on each patient, and its window.
TRIES = {
    "lm": ("amp,sdpa,compile,fused-optimizer", ["--warmup", "5", "--steps", "10"]),
    "mlp": ("cuda-graphs,fused-optimizer,batch-size", ["--warmup", "10", "--steps", "200"]),
    # As a new user runs it: every change, the default window and the default budget.
    "decoder": ("all", []),
}
TINY_TRIES = {
    "decoder": ("amp,sdpa,fused-optimizer", ["--warmup", "2", "--steps", "3", "--budget", "90"]),
    "lm": ("amp,sdpa,fused-optimizer", ["--warmup", "2", "--steps", "3"]),
    "mlp": ("batch-size,fused-optimizer,cuda-graphs", ["--warmup", "3", "--steps", "20"]),
}


def lm_grid(tiny: bool) -> list[list[str]]:
    """amp × sdpa × fused eagerly (sync every 100 steps: the .item() advice is not in question
    here), plus torch.compile on the corner with all three (compiling costs ~1 min a point)."""
    grid = []
    for amp, sdpa, fused in itertools.product((False, True), repeat=3):
        grid.append(["--sync-every", "100"] + ["--amp"] * amp + ["--sdpa"] * sdpa + ["--fused"] * fused)
    if not tiny:
        grid.append(["--sync-every", "100", "--amp", "--sdpa", "--fused", "--compile"])
    return grid


def decoder_grid(tiny: bool) -> list[list[str]]:
    """The changes issue 29 names, kept small enough for one 9-minute command: bf16 autocast ×
    SDPA × fused AdamW eagerly, TF32 alone and with SDPA + fused, and torch.compile on the corner
    with bf16 + SDPA + fused (a compiled point costs ~1 min). The loss is read every 100 steps
    at every point (the per-step .item() is advice of its own, not in question here)."""
    grid = []
    for amp, sdpa, fused in itertools.product((False, True), repeat=3):
        grid.append(["--sync-every", "100"] + ["--amp"] * amp + ["--sdpa"] * sdpa + ["--fused"] * fused)
    grid += [["--sync-every", "100", "--tf32"], ["--sync-every", "100", "--tf32", "--sdpa", "--fused"]]
    if not tiny:
        grid.append(["--sync-every", "100", "--amp", "--sdpa", "--fused", "--compile"])
    return grid


def mlp_grid(tiny: bool, batch: int) -> list[list[str]]:
    """CUDA graphs (compile mode reduce-overhead) × fused Adam × batch ×1, ×4, ×8 × .item() every
    1 or 100 steps."""
    grid = []
    modes = ("none",) if tiny else ("none", "reduce-overhead")
    for mode, fused, factor, sync in itertools.product(modes, (False, True), (1, 4, 8), (1, 100)):
        flags = ["--batch-size", str(batch * factor), "--lr-scale", f"{math.sqrt(factor):g}",
                 "--sync-every", str(sync)] + ["--fused"] * fused
        grid.append(flags + (["--compile-mode", mode] if mode != "none" else []))
    return grid


def advice_to_flags(advice: list[dict]) -> list[str]:
    """The perf JSON's advice as the patient's flags — no judgment involved. A larger batch
    comes with the learning rate the advice names for Adam/AdamW (√K)."""
    flags: list[str] = []
    changes = {item["change"]: item for item in advice}
    for change, item in changes.items():
        if change == "amp":
            flags.append("--amp")
        elif change == "sdpa":
            flags.append("--sdpa")
        elif change == "fused-optimizer":
            flags.append("--fused")
        elif change == "tf32":
            flags.append("--tf32")
        elif change == "fewer-syncs":
            flags += ["--sync-every", "100"]
        elif change == "cuda-graphs":
            flags += ["--compile-mode", "reduce-overhead"]
        elif change == "compile" and "cuda-graphs" not in changes:
            flags.append("--compile")
        elif change == "batch-size":
            flags += ["--batch-size", str(item["batch_size"]), "--lr-scale", f"{math.sqrt(item['factor']):g}"]
    return flags


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure_in_process(script: Path, patient: str, base: list[str], flags: list[str]) -> float:
    """Samples/s of one configuration, fresh model and optimizer, in this process."""
    import torch

    module = _load(script, f"patient_{patient}")
    args = module.parse(base + flags)
    torch._dynamo.reset()  # every compiled point compiles its own graphs, none inherits guards
    if patient in ("lm", "decoder"):
        model, step_model, optimizer = module.build(args)
        rate = module.train(args, model, step_model, optimizer)
    else:
        loader = module.build_loader(args)
        model, step_model, optimizer = module.build(args)
        rate = module.train(args, loader, model, step_model, optimizer)
    del model, step_model, optimizer
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rate


def run_perf(work: Path, script: Path, base: list[str], tries: str, window: list[str], repeats: int,
             timeout: int) -> tuple[dict, str, float]:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    report = work / "perf.json"
    command = [sys.executable, "-m", "nndoctor", "perf", *window, "--try", tries, "--try-repeats", str(repeats),
               "--json", str(report), str(script), *base, "--steps", "100000"]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=work)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"nndoctor perf did not finish within {timeout} s (--perf-timeout)") from None
    seconds = time.perf_counter() - started
    if not report.exists():
        raise SystemExit(f"nndoctor perf wrote no report (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(report.read_text()), done.stderr, seconds


def run_patient(args: argparse.Namespace, out: Path, work: Path) -> dict:
    """``--stage perf`` runs nndoctor perf and saves its report; ``--stage grid`` reads that
    report (``--perf-report``) and times naive, advised and the grid; ``all`` does both (the
    two stages fit the device tool's 10-minute calls one at a time)."""
    patient = args.patient
    script = work / f"{patient}.py"
    script.write_text(SCRIPTS[patient])
    base = (TINY if args.tiny else FULL)[patient]
    tries, window = (TINY_TRIES if args.tiny else TRIES)[patient]
    results: dict = {"patient": patient, "tiny": args.tiny, "base_flags": base, "tries": tries}
    try:
        import torch

        results["card"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        results["torch"] = torch.__version__
    except ImportError:
        raise SystemExit("torch is not installed") from None
    if not args.tiny and results["card"] == "cpu":
        raise SystemExit(f"--patient {patient} needs a CUDA GPU; pass --tiny for the CPU smoke test")

    if args.stage in ("perf", "all"):
        report, terminal, seconds = run_perf(work, script, base, tries, window, args.try_repeats,
                                             timeout=args.perf_timeout)
        (out / f"perf_{patient}_report.json").write_text(json.dumps(report, indent=1))
        (out / f"perf_{patient}_terminal.txt").write_text(terminal)
        results["perf_seconds"] = seconds
    else:
        if not args.perf_report:
            raise SystemExit("--stage grid needs --perf-report (the perf_<patient>_report.json of --stage perf)")
        report = json.loads(Path(args.perf_report).read_text())
        results["perf_report"] = str(args.perf_report)
    perf = report["extra"]["perf"]
    advised = advice_to_flags(perf["advice"])
    results.update({
        "step_class": perf.get("step_class"), "advice": perf["advice"], "advised_flags": advised,
        "findings": [f"{f['code']} {f['severity']}: {f['message']}" for f in report["findings"]],
        "trials": {name: {k: v for k, v in trial.items() if k not in ("times_s",)}
                   for name, trial in perf["trials"].items() if isinstance(trial, dict)},
    })
    print(f"nndoctor perf: class {perf.get('step_class', {}).get('class')}; advised flags {advised}", flush=True)
    if args.stage == "perf":
        return results

    batch = int(base[base.index("--batch-size") + 1]) if "--batch-size" in base else (32 if patient == "mlp" else 16)
    grid = {"lm": lambda: lm_grid(args.tiny), "decoder": lambda: decoder_grid(args.tiny),
            "mlp": lambda: mlp_grid(args.tiny, batch)}[patient]()
    rows: list[dict] = []

    def one(label: str, flags: list[str], round_index: int) -> None:
        started = time.perf_counter()
        try:
            rate = measure_in_process(script, patient, base, flags)
        except Exception as error:  # noqa: BLE001 - an OOM grid point is a row, not the end
            rate, error_text = None, f"{type(error).__name__}: {str(error)[:300]}"
        else:
            error_text = None
        rows.append({"label": label, "flags": flags, "round": round_index, "samples_per_s": rate,
                     "seconds": round(time.perf_counter() - started, 1), **({"error": error_text} if error_text else {})})
        print(json.dumps(rows[-1]), flush=True)
        with open(out / f"rows_{patient}.jsonl", "a") as handle:  # kept if the run is cut short
            handle.write(json.dumps(rows[-1]) + "\n")

    # Every configuration once per round, fresh model each time; odd rounds in reverse order,
    # so drift and warm caches hit every point alike. The summary takes each one's median.
    configurations = [("naive", []), ("advised", advised)] + [("grid", flags) for flags in grid]
    for round_index in range(args.grid_repeats):
        order = configurations if round_index % 2 == 0 else configurations[::-1]
        for label, flags in order:
            one(label, flags, round_index)
    results["grid_repeats"] = args.grid_repeats
    results["rows"] = rows
    results["summary"] = summarize(rows)
    print(json.dumps(results["summary"], indent=1), flush=True)
    return results


def confirm(args: argparse.Namespace, out: Path, work: Path) -> dict:
    """``--stage confirm``: the grid's best point was picked as the highest of many noisy medians,
    so its median is biased upwards (the winner's curse: on a host-bound step one
    configuration's runs spread ±20%). Re-measure, on fresh runs, the advised flags and the
    grid's ``--confirm-top`` best points, interleaved (odd rounds reversed), and compare
    advised with the best of them by these medians only."""
    grid_result = json.loads(Path(args.grid_result).read_text())
    patient = grid_result["patient"]
    script = work / f"{patient}.py"
    script.write_text(SCRIPTS[patient])
    base = grid_result["base_flags"]
    advised = grid_result["advised_flags"]
    confirmed = fresh_confirm(script, patient, base, advised, grid_result["rows"], args.confirm_top,
                              args.confirm_repeats)
    confirmed["summary"]["grid_selection"] = grid_result.get("summary")
    return {"patient": patient, "card": grid_result.get("card"), "base_flags": base, **confirmed}


def fresh_confirm(script: Path, patient: str, base: list[str], advised: list[str], grid_rows: list[dict],
                  top: int, repeats: int) -> dict:
    """The advised flags and the grid's ``top`` best points re-measured on fresh runs,
    interleaved (odd rounds reversed); advised/best by these medians only (winner's curse)."""
    grid_rows = [r for r in grid_rows if r["samples_per_s"]]
    by_flags: dict[frozenset[str], list[float]] = {}
    labels: dict[frozenset[str], list[str]] = {}
    for row in grid_rows:
        key = _key(row["flags"])
        labels.setdefault(key, row["flags"])
        by_flags.setdefault(key, []).append(row["samples_per_s"])
    ranked = sorted(by_flags, key=lambda key: statistics.median(by_flags[key]), reverse=True)
    candidates = [("advised", advised)] + [("grid", labels[key]) for key in ranked[:top]
                                           if key != _key(advised)]
    rows: list[dict] = []
    for round_index in range(repeats):
        order = candidates if round_index % 2 == 0 else candidates[::-1]
        for label, flags in order:
            rate = measure_in_process(script, patient, base, flags)
            rows.append({"label": label, "flags": flags, "round": round_index, "samples_per_s": rate})
            print(json.dumps(rows[-1]), flush=True)
    medians = {" ".join(flags) or "(naive)": statistics.median(r["samples_per_s"] for r in rows
                                                                if _key(r["flags"]) == _key(flags))
               for _, flags in candidates}
    advised_median = medians[" ".join(advised) or "(naive)"]
    best_flags = max(medians, key=medians.get)
    summary = {
        "statistic": f"median over {repeats} fresh interleaved rounds",
        "advised_flags": advised, "advised_samples_per_s": advised_median,
        "best_flags": best_flags, "best_samples_per_s": medians[best_flags],
        "advised_over_best": advised_median / medians[best_flags], "medians": medians,
    }
    summary["advised_within_90pct_of_best"] = summary["advised_over_best"] >= 0.9
    print(json.dumps(summary, indent=1), flush=True)
    return {"rows": rows, "summary": summary}


def run_decoder(args: argparse.Namespace, out: Path, work: Path) -> dict:
    """Issue 29's benchmark in one command: ``nndoctor perf --try all`` with the default budget
    on the decoder, the grid (one round), then the advice and the grid's best point re-measured
    fresh and interleaved. The JSON says how long perf took, what it advised (the combination
    and the ratio it measured) and advised / fresh best."""
    started = time.perf_counter()
    results = run_patient(args, out, work)
    if args.stage != "all":
        return results
    perf_trials = results.get("trials") or {}
    # Written now and again at the end: a call cut short still leaves perf's result and the grid.
    partial = Path(args.out) if str(args.out).endswith(".json") else out / "perf_advice_decoder.json"
    partial.write_text(json.dumps({**results, "stage_done": "perf and grid"}, indent=1, default=str))
    print(f"perf and grid done after {time.perf_counter() - started:.0f} s; re-measuring fresh", flush=True)
    script = work / "decoder.py"
    confirmed = fresh_confirm(script, "decoder", results["base_flags"], results["advised_flags"],
                              results["rows"], args.confirm_top, args.confirm_repeats)
    combination = next((a for a in results["advice"] if a.get("change") == "combination"), None)
    results["fresh"] = confirmed
    results["headline"] = {
        "card": results.get("card"),
        "perf_wall_s": round(results.get("perf_seconds") or 0.0, 1),
        "perf_budget_s": (perf_trials.get("budget") or {}).get("seconds"),
        "perf_budget_used_s": (perf_trials.get("budget") or {}).get("used_s"),
        "advised_changes": [a["change"] for a in results["advice"] if a.get("change") != "combination"],
        "advised_flags": results["advised_flags"],
        "advice_combination": combination,
        "perf_best_point": perf_trials.get("best"),
        "not_measured_by_perf": sorted(name for name, t in perf_trials.items()
                                       if isinstance(t, dict) and t.get("not_measured")),
        "fresh_best_flags": confirmed["summary"]["best_flags"],
        "advised_over_fresh_best": confirmed["summary"]["advised_over_best"],
        "advised_within_90pct_of_best": confirmed["summary"]["advised_within_90pct_of_best"],
        "grid_advised_over_naive": (results.get("summary") or {}).get("advised_over_naive"),
        "total_wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(results["headline"], indent=1), flush=True)
    return results


def summarize(rows: list[dict]) -> dict:
    """Each configuration's median samples/s over the rounds (and its spread); the best
    configuration of the grid and advice; the ratios the benchmark asks about. When the
    advised flags equal a grid point (same flags in any order), both are one configuration."""
    by_flags: dict[frozenset[str] | tuple[str, ...], list[float]] = {}
    labels: dict = {}
    for row in rows:
        key = _key(row["flags"])
        labels.setdefault(key, row["flags"])
        if row["samples_per_s"]:
            by_flags.setdefault(key, []).append(row["samples_per_s"])
    medians = {key: statistics.median(values) for key, values in by_flags.items()}
    naive = medians[_key([])]
    advised_key = _key(next(r["flags"] for r in rows if r["label"] == "advised"))
    advised = medians[advised_key]
    best_key = max(medians, key=medians.get)
    best = medians[best_key]
    spread = {" ".join(labels[key]) or "(naive)": [round(min(v)), round(statistics.median(v)), round(max(v))]
              for key, v in by_flags.items()}
    summary = {
        "statistic": "median over rounds", "naive_samples_per_s": naive, "advised_samples_per_s": advised,
        "best_samples_per_s": best, "best_flags": list(labels[best_key]),
        "advised_is_best": best_key == advised_key,
        "advised_over_naive": advised / naive, "best_over_naive": best / naive,
        "advised_over_best": advised / best, "min_median_max": spread,
    }
    summary["advised_within_90pct_of_best"] = summary["advised_over_best"] >= 0.9
    summary["advised_at_least_2x_where_best_is"] = (summary["advised_over_naive"] >= 2.0
                                                    if summary["best_over_naive"] >= 2.0 else None)
    return summary


def _key(flags: list[str]) -> frozenset[str]:
    """Flags as a configuration: options with their values, order-free."""
    pairs, index = [], 0
    while index < len(flags):
        flag = flags[index]
        if index + 1 < len(flags) and not flags[index + 1].startswith("--"):
            pairs.append(f"{flag}={flags[index + 1]}")
            index += 2
        else:
            pairs.append(flag)
            index += 1
    return frozenset(pairs)
