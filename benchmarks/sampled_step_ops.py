"""A sampled step's ATen operations and host reads, per check — on the CPU, counted, not timed.

On a GPU every small ATen operation a check's handler runs is a kernel launch (~5–10 µs) and
every read of a device value by the host (``item()``, ``float(t)``, ``bool(t)``, ``tolist()``,
``cpu()``, ``torch.equal``, ``nonzero``…) is a synchronisation that drains the launch queue.
Both can be counted on a CPU: this script trains the launch-bound MLP of
``ddp_overhead.py --model mlp`` (64 → 4×256 → 10, batch 32, Adam, ``loss.item()`` every step)
under ``nndoctor.watch()`` with every step sampled (``NNDOCTOR_SAMPLE_EVERY=1``), and over
``--steps`` steps after the warm-up counts, with a ``TorchDispatchMode``, the operations that
nndoctor's code ran, attributed to the handler that was running (the frame that the session's
dispatch loop called) or to the instrumentation around them (hooks, probes). Host reads:
``aten._local_scalar_dense``, ``aten.equal``, ``aten.nonzero``, ``aten.is_nonzero``, indexing
with a boolean mask (its size is read: ``nonzero`` on a GPU) and the
Python-level ``tolist``/``cpu``/``numpy``/``to("cpu")`` of a tensor (on a CPU these dispatch
nothing, so they are counted where they are called; a ``tolist()`` of what ``cpu()`` returned
is the same read, counted once, and operations on host copies are not counted: on a GPU they
launch nothing). Views (``func.is_view``) are counted apart: they launch no kernel either. Printed per step (mean over ``--steps``).

    python benchmarks/sampled_step_ops.py --steps 20
"""

from __future__ import annotations

import argparse
import os
import sys
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

os.environ["NNDOCTOR_SAMPLE_EVERY"] = "1"  # read when nndoctor is imported

SYNC_OPS = {"_local_scalar_dense", "equal", "nonzero", "is_nonzero", "nonzero_static"}
MASK_OPS = {"index", "index_put", "index_put_", "masked_select"}  # a boolean mask: its size read (nonzero)
HOST_METHODS = ("tolist", "cpu", "numpy")
NNDOCTOR_DIR = str(Path(__import__("importlib").util.find_spec("nndoctor").origin).parent)  # type: ignore[union-attr]
TORCH_DIR = str(Path(__import__("importlib").util.find_spec("torch").origin).parent)  # type: ignore[union-attr]


def _has_mask(args: tuple) -> bool:
    import torch

    for arg in args:
        for item in arg if isinstance(arg, (list, tuple)) else (arg,):
            if isinstance(item, torch.Tensor) and item.dtype == torch.bool:
                return True
    return False


def _passes_through(frame: Any, callee: Any) -> bool:
    """Is this nndoctor frame a wrapper calling the function it wraps (its ``original…``)?"""
    for name, value in frame.f_locals.items():
        if name.startswith("original") and getattr(getattr(value, "__func__", value), "__code__", None) is callee:
            return True
    return False


def _owner(emit_code: Any) -> str | None:
    """Who ran the current operation: ``CODE.on_kind`` for a handler the session called,
    ``(module.function)`` for other nndoctor code (hooks, probes), None for the patient (and torch alone)."""
    frame = sys._getframe(2)
    first_outside_torch = None
    first_nndoctor = ""
    child = None
    while frame is not None:
        back = frame.f_back
        filename = frame.f_code.co_filename
        if first_outside_torch is None and not filename.startswith(TORCH_DIR) and filename != __file__:
            first_outside_torch = filename
            if not filename.startswith(NNDOCTOR_DIR):
                return None  # the patient's own operation (its code called torch)
            if child is not None and _passes_through(frame, child.f_code):
                return None  # the patient's forward, loss, backward… called through nndoctor's wrapper
            first_nndoctor = f"{Path(filename).stem}.{frame.f_code.co_name}"
        if back is not None and back.f_code is emit_code:
            subscriber = frame.f_locals.get("self")
            code = getattr(subscriber, "code", None) or type(subscriber).__name__
            return f"{code}.{frame.f_code.co_name}"
        child, frame = frame, back
    return f"({first_nndoctor})" if first_outside_torch else None


class Counts:
    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()
        self.views: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.read_kinds: Counter[tuple[str, str]] = Counter()
        self.on = False


def measure(steps: int, warmup: int, batch: int) -> tuple[Counts, Any]:
    import torch
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

    import nndoctor
    from nndoctor.core.engine import DEFAULT_FULL_WINDOW, Session

    emit_code = Session.emit.__code__
    counts = Counts()

    # What cpu()/to("cpu") returned (by id, checked by a weak reference: a tensor's == is
    # elementwise): reading it again costs no synchronisation.
    on_host: dict[int, Any] = {}

    def note_read(name: str) -> None:
        owner = _owner(emit_code)
        if owner is not None:
            counts.reads[owner] += 1
            counts.read_kinds[(owner, name)] += 1

    class CountOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            if counts.on and _all_on_host(args, kwargs):
                # Arithmetic on what was already copied to the host: no launch on a GPU either.
                out = func(*args, **(kwargs or {}))
                for t in (out if isinstance(out, (tuple, list)) else (out,)):
                    if isinstance(t, torch.Tensor):
                        on_host[id(t)] = weakref.ref(t)
                return out
            if counts.on:
                owner = _owner(emit_code)
                if owner is not None:
                    counts.ops[owner] += 1
                    counts.views[owner] += func.is_view  # a view launches nothing on a GPU
                    name = func.overloadpacket.__name__
                    if name in SYNC_OPS or (name in MASK_OPS and _has_mask(args)):
                        counts.reads[owner] += 1
                        counts.read_kinds[(owner, name)] += 1
            return func(*args, **(kwargs or {}))

    originals = {name: getattr(torch.Tensor, name) for name in (*HOST_METHODS, "to")}

    def counting(name: str):
        original = originals[name]

        def method(self, *args, **kwargs):
            counted = counts.on and (name != "to" or _to_cpu(args, kwargs)) and not _on_host(self)
            if counted:
                note_read(name if name != "to" else "to(cpu)")
            result = original(self, *args, **kwargs)
            if counted and isinstance(result, torch.Tensor):
                if result is self:  # cpu() of a CPU tensor: mark an alias, not the tensor itself
                    counts.on = False
                    try:
                        result = result.view_as(result)
                    finally:
                        counts.on = True
                on_host[id(result)] = weakref.ref(result)
            return result
        return method

    def _on_host(tensor: Any) -> bool:
        ref = on_host.get(id(tensor))
        return ref is not None and ref() is tensor

    def _all_on_host(args: tuple, kwargs: dict | None) -> bool:
        tensors = [a for a in (*args, *(kwargs or {}).values()) for a in (a if isinstance(a, (list, tuple)) else (a,))
                   if isinstance(a, torch.Tensor)]
        return bool(tensors) and all(_on_host(t) for t in tensors)

    def _to_cpu(args: tuple, kwargs: dict) -> bool:
        target = kwargs.get("device", args[0] if args else None)
        return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    layers: list[nn.Module] = []
    width = 64
    for _ in range(4):
        layers += [nn.Linear(width, 256), nn.ReLU()]
        width = 256
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    dataset = TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g))
    sampler = BatchSampler(RandomSampler(dataset, generator=torch.Generator().manual_seed(1)),
                           batch_size=batch, drop_last=True)
    loader = DataLoader(dataset, sampler=sampler, batch_size=None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    warmup = max(warmup, DEFAULT_FULL_WINDOW)  # past the window: sampled steps, not "full" ones

    for name in originals:
        setattr(torch.Tensor, name, counting(name))
    try:
        with nndoctor.watch() as report, CountOps():
            step = 0
            while step < warmup + steps:
                for x, y in loader:
                    counts.on = step >= warmup
                    optimizer.zero_grad()
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
                    loss.item()
                    step += 1
                    if step >= warmup + steps:
                        break
            counts.on = False
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return counts, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--reads", action="store_true", help="also list the kinds of host reads per check")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    counts, report = measure(args.steps, args.warmup, args.batch)
    if report.internal_errors:
        print(f"internal errors: {report.internal_errors[:3]}", file=sys.stderr)
    owners = sorted(set(counts.ops) | set(counts.reads), key=lambda o: (-counts.ops[o], o))
    per = float(args.steps)
    print(f"one sampled step of the MLP (mean of {args.steps} steps, every check):")
    print(f"{'who':<44} {'ATen ops':>9} {'of them views':>14} {'host reads':>11}")
    for owner in owners:
        print(f"{owner:<44} {counts.ops[owner] / per:9.1f} {counts.views[owner] / per:14.1f} "
              f"{counts.reads[owner] / per:11.1f}")
    print(f"{'total':<44} {sum(counts.ops.values()) / per:9.1f} {sum(counts.views.values()) / per:14.1f} "
          f"{sum(counts.reads.values()) / per:11.1f}")
    if args.reads:
        print("\nhost reads by kind:")
        for (owner, name), n in sorted(counts.read_kinds.items(), key=lambda kv: -kv[1]):
            print(f"  {owner:<44} {name:<22} {n / per:6.1f}")


if __name__ == "__main__":
    main()
