"""Explaining CUDA out-of-memory (E108): the numbers in torch's message, and where the memory
went (weights, gradients, optimizer state, activations), counted from the live objects."""

from __future__ import annotations

import re
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation
from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.evidence import context_inputs, module_phrase
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register

_MEMORY_FIELDS = {
    "requested": r"Tried to allocate (?P<v>[\d.]+ [KMGT]i?B)",
    "total": r"total capacity of (?P<v>[\d.]+ [KMGT]i?B)",
    "free": r"of which (?P<v>[\d.]+ [KMGT]i?B) is free",
    "process_in_use": r"this process has (?P<v>[\d.]+ [KMGT]i?B) memory in use",
    "allocated_by_pytorch": r"(?P<v>[\d.]+ [KMGT]i?B) is allocated by PyTorch",
    "reserved_unallocated": r"(?P<v>[\d.]+ [KMGT]i?B) is reserved by PyTorch but unallocated",
}


def parse_size(text: str) -> float:
    """``"2.00 GiB"`` -> bytes."""
    number, unit = text.split()
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
             "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]
    return float(number) * scale


def memory_facts(message: str) -> dict[str, str]:
    facts = {}
    for key, pattern in _MEMORY_FIELDS.items():
        match = re.search(pattern, message)
        if match:
            facts[key] = match.group("v")
    return facts


def memory_diagnosis(facts: dict[str, str]) -> list[str]:
    """What the allocator's numbers say, as sentences (pure: used by tests)."""
    notes: list[str] = []
    try:
        sizes = {k: parse_size(v) for k, v in facts.items()}
    except (ValueError, KeyError):
        return notes
    total, free, mine = sizes.get("total"), sizes.get("free"), sizes.get("process_in_use")
    requested = sizes.get("requested")
    if total and free is not None and mine is not None:
        others = total - free - mine
        if others > 0.25 * total:
            notes.append(f"other processes hold about {others / 2**30:.1f} GiB of this GPU (check nvidia-smi)")
    if requested and total and requested > total:
        notes.append(f"a single allocation of {facts['requested']} is larger than the whole GPU "
                     f"({facts['total']}): the batch or an intermediate is far too big")
    elif requested and free is not None and requested > free:
        notes.append(f"the request ({facts['requested']}) exceeds the free memory ({_gib(free)})")
    reserved = sizes.get("reserved_unallocated")
    if reserved and total and reserved > 0.1 * total:
        notes.append(f"{facts['reserved_unallocated']} is reserved but unallocated (fragmentation): "
                     "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    return notes


def _tensor_bytes(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


def memory_accounting(models: list[Any], optimizers: list[Any], device_type: str = "cuda",
                      index: int | None = None) -> dict[str, Any]:
    """Bytes of the trained models' parameters and gradients and of the optimizers' state on
    ``device_type`` (device ``index`` only, when given) — sizes only (numel × element size):
    no allocation, no synchronisation, safe right after an out-of-memory error. Shared
    tensors are counted once."""
    seen: set[int] = set()

    def on_device(t: Any) -> bool:
        device = getattr(t, "device", None)
        return device is not None and device.type == device_type and (index is None or device.index == index)

    def count(tensors) -> int:
        total = 0
        for t in tensors:
            if t is None or not on_device(t) or id(t) in seen:
                continue
            seen.add(id(t))
            total += _tensor_bytes(t)
        return total

    params = [p for m in models for p in m.parameters()]
    accounting: dict[str, Any] = {"parameters": count(params), "gradients": count(p.grad for p in params)}
    state_bytes, kinds = 0, []
    for opt in optimizers:
        kinds.append(type(opt).__name__)
        state_bytes += count(v for per_param in opt.state.values() if isinstance(per_param, dict)
                             for v in per_param.values() if hasattr(v, "numel"))
    accounting["optimizer_state"] = state_bytes
    accounting["optimizers"] = sorted(set(kinds))
    return accounting


def _live_memory_accounting(crash: Crash) -> dict[str, Any] | None:
    """What the crashed run's models and optimizers hold on the GPU, and what the allocator had."""
    session = crash.session
    if session is None:
        return None
    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        # The GPU that ran out: named in the message ("GPU 1 has a total capacity ..."), else
        # the current one; parameters on other GPUs are not in its allocator's numbers.
        match = re.search(r"\bGPU (\d+)\b", crash.message)
        index = int(match.group(1)) if match else torch.cuda.current_device()
        models = session.state.trained_roots() or list(session.state.roots)
        accounting = memory_accounting(models, list(session.state.optimizers), index=index)
        accounting["allocated"] = int(torch.cuda.memory_allocated(index))
        accounting["device_index"] = index
        return accounting
    except Exception:  # noqa: BLE001 - evidence is optional; the explanation stands without it
        return None


def memory_breakdown(accounting: dict[str, Any]) -> str | None:
    """The allocated memory split into model state and the rest, as a sentence (pure)."""
    allocated = accounting.get("allocated") or 0
    state = accounting["parameters"] + accounting["gradients"] + accounting["optimizer_state"]
    if allocated <= 0 or state <= 0:
        return None
    rest = max(0, allocated - state)
    optimizers = "/".join(accounting.get("optimizers") or []) or "optimizer"
    sentence = (f"of the {_gib(allocated)} this process had allocated, parameters take "
                f"{_gib(accounting['parameters'])}, gradients {_gib(accounting['gradients'])}, "
                f"{optimizers} state {_gib(accounting['optimizer_state'])}; the other {_gib(rest)} are "
                "activations, batches and other tensors")
    if rest >= 0.5 * allocated:
        sentence += " — the batch and what the forward keeps for backward are the lever"
    else:
        sentence += (" — the model's own state is the bulk: a smaller model, mixed-precision weights, "
                     "an optimizer with less state, or sharding")
    return sentence


def _gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


@register
class OutOfMemory(CrashExplanation):
    """
    ## What it does
    Explains "CUDA out of memory": reads the allocator's numbers (requested, total, free,
    used by this process, reserved but unallocated), says whether other processes hold the
    GPU, whether one allocation is larger than the card, or whether fragmentation is to
    blame, and names the module and input shapes at the moment of the crash. In a live run
    it also splits the memory the process had allocated into the trained models' parameters,
    their gradients, the optimizers' state and the rest (activations, batches, other
    tensors), so it is clear whether the batch or the model is the lever.

    ## Why is this bad?
    The usual causes are a batch too large for the card, an evaluation loop without
    ``torch.no_grad()`` (activations kept for a backward that never comes), loss tensors kept
    with their graphs (``losses.append(loss)``), or another process on the same GPU.

    ## Example
    ```python
    for x, y in val_loader:
        out = model(x.cuda())           # graph kept: no torch.no_grad()
        losses.append(criterion(out, y.cuda()))
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        ...
        losses.append(loss.item())
    ```
    Or a smaller batch, mixed precision (``torch.autocast``), gradient checkpointing.

    ## References
    - PyTorch notes, "CUDA memory management" (PYTORCH_CUDA_ALLOC_CONF).
    - Recorded message: tests/fixtures/crash/recorded/E108_out_of_memory.txt.
    """

    code = "E108"
    name = "out-of-memory"
    summary = "the GPU ran out of memory"
    fix = ("reduce the batch size; use torch.no_grad() for evaluation, loss.item() for logging, "
           "torch.autocast for mixed precision")
    patterns = (r"CUDA out of memory", r"OutOfMemoryError", r"CUDA error: out of memory",
                r"MPS backend out of memory", r"HIP out of memory")
    order = 10

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        numbers = memory_facts(crash.message)
        notes = memory_diagnosis(numbers)
        evidence: dict[str, Any] = dict(numbers)
        accounting = _live_memory_accounting(crash)
        if accounting is not None:
            evidence["memory_accounting"] = accounting
            breakdown = memory_breakdown(accounting)
            if breakdown:
                notes.append(breakdown)
        inputs = context_inputs(crash)
        if inputs:
            evidence["inputs"] = inputs
        if crash.context:
            evidence["training"] = crash.context.get("training")
        where = module_phrase(crash)
        request = f" allocating {numbers['requested']}" if "requested" in numbers else ""
        message = f"The GPU ran out of memory{request}{where}."
        if "total" in numbers:
            message += f" Card: {numbers['total']}, free: {numbers.get('free', '?')}, this process: {numbers.get('process_in_use', '?')}."
        if notes:
            message += " " + " ".join(n[0].upper() + n[1:] + "." for n in notes)
        fix = cls.fix
        if any("other processes" in n for n in notes):
            fix = "free the GPU (nvidia-smi shows who holds it) or pick another with CUDA_VISIBLE_DEVICES; " + fix
        return cls.make(crash, message, fix=fix, evidence=evidence)
