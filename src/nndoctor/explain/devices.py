"""Explanations of device and dtype crashes: E101, E102, E123, and the CUDA-only E108, E109, E120, E121."""

from __future__ import annotations

import os
import re
from typing import Any

from nndoctor.explain.base import CrashExplanation
from nndoctor.explain.crash import Crash
from nndoctor.explain.evidence import context_inputs, describe_tensor, live_objects, module_phrase
from nndoctor.explain.source import discarded_moves, line_text
from nndoctor.findings import Finding
from nndoctor.registry import register


def devices_in_message(text: str) -> list[str]:
    """Device names a device-mismatch message mentions, in order (``cuda:0``, ``cpu``, ``meta``)."""
    found: list[str] = []
    for device in re.findall(r"\b(cuda:\d+|cuda|cpu|mps|meta|xpu:\d+|xpu)\b", text):
        if device not in found:
            found.append(device)
    legacy = re.findall(r"torch\.(cuda\.)?\w+Tensor", text)  # "Input type (torch.cuda.FloatTensor)"
    for prefix in legacy:
        device = "cuda" if prefix else "cpu"
        if device not in found:
            found.append(device)
    return found


@register
class DeviceMismatch(CrashExplanation):
    """
    ## What it does
    Explains "Expected all tensors to be on the same device" (and its variants "Tensor on
    device cpu is not on the expected device meta", "Input type (torch.cuda.FloatTensor) and
    weight type (torch.FloatTensor) should be the same"): names the module that was running,
    the device of each of its inputs and parameters, and points at an unassigned
    ``x.to(device)`` statement near the failing line when there is one.

    ## Why is this bad?
    One operation received tensors on two devices. The classic cause is
    ``x.to(device)`` written as a statement: ``Module.to`` moves a model in place, but
    ``Tensor.to`` returns a *new* tensor and leaves ``x`` where it was. Others: a tensor
    created inside ``forward`` with ``torch.zeros(...)`` (on the CPU by default), a custom
    function building data on another GPU.

    ## Example
    ```python
    model = Net().to(device)
    x.to(device)          # result thrown away
    out = model(x)        # x is still on the CPU
    ```

    ## Use instead
    ```python
    x = x.to(device)
    torch.zeros(n, device=x.device)   # inside forward: create on the input's device
    ```

    ## References
    - PyTorch docs, ``torch.Tensor.to`` (returns a copy) vs ``torch.nn.Module.to`` (in place).
    - Recorded GPU message: tests/fixtures/crash/recorded/E101_device_mismatch.txt.
    """

    code = "E101"
    name = "device-mismatch"
    summary = "tensors on different devices met in one operation"
    fix = "move every input to the model's device (x = x.to(device)); create new tensors on the input's device"
    patterns = (
        r"Expected all tensors to be on the same device",
        r"Tensor on device \S+ is not on the expected device",
        r"Input type \(torch\.cuda\.\w+Tensor\) and weight type \(torch\.(?!cuda)\w+Tensor\)",
        r"Input type \(torch\.(?!cuda)\w+Tensor\) and weight type \(torch\.cuda\.\w+Tensor\)",
        r"indices should be either on cpu or on the same device as the indexed tensor",
        r"Expected object of device type \w+ but got device type \w+",
        r"to have the same device as tensor for argument",
    )
    order = 20  # before E102, whose "Input type … should be the same" also covers dtypes

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        devices = devices_in_message(crash.message)
        evidence: dict[str, Any] = {}
        if devices:
            evidence["devices"] = devices
        inputs = context_inputs(crash)
        params = crash.context.get("parameters") or {}
        where = module_phrase(crash)
        detail = ""
        if inputs:
            evidence["inputs"] = inputs
        if params:
            evidence["parameters"] = params
            param_devices = sorted({p.rsplit("@", 1)[-1] for p in params.values()})
            input_devices = sorted({i.rsplit("@", 1)[-1] for i in inputs})
            if param_devices and input_devices and param_devices != input_devices:
                detail = (f": its input is on {', '.join(input_devices)} but its parameters are on "
                          f"{', '.join(param_devices)}")
        message = f"Tensors on different devices ({' and '.join(devices) or 'two devices'}) met{where}{detail}."
        fix = cls.fix
        frame = crash.user_frame
        if frame is not None and frame.line:
            moves = discarded_moves(frame.path, frame.line)
            tensor_moves = [m for m in moves if _is_tensor_name(crash, m.target)]
            certain = bool(tensor_moves) or not crash.is_live
            chosen = tensor_moves or ([] if crash.is_live else moves)
            if chosen and certain:
                move = chosen[0]
                evidence["unassigned_move"] = f"line {move.line}: {move.text}"
                message += (f" Line {move.line} `{move.text}` does not move `{move.target}`: Tensor.to() "
                            f"returns a new tensor and leaves the original where it was.")
                assigned = f"{move.target} = {move.text.split('#')[0].strip()}"
                fix = f"assign the result: `{assigned}` (line {move.line})"
        return cls.make(crash, message, fix=fix, evidence=evidence)


def _is_tensor_name(crash: Crash, expression: str) -> bool:
    """Is ``expression`` (a plain name) a tensor in the crashing frames? (Module.to is in place.)"""
    if not crash.is_live:
        return False
    if not expression.isidentifier():
        return True  # batch["x"].to(...) / self.x.to(...): results of indexing are tensors or dicts
    for name, value in live_objects(crash, lambda v: True):
        if name == expression:
            return describe_tensor(value) is not None
    return False


_DTYPE_PATTERNS = (
    r"expected scalar type (?P<expected>\w+) but found (?P<found>\w+)",
    r"mat1 and mat2 must have the same dtype, but got (?P<found>\w+) and (?P<expected>\w+)",
    r"Input type \((?P<found>[\w ]+)\) and (?:weight|bias) type \((?P<expected>[\w ]+)\) should be the same",
    r"expected target dtype to be (?P<expected>Long or Byte), but got (?P<found>\w+)",
    r"Expected tensor for argument #\d+ '(?P<argument>\w+)' to have (?:one of the following )?scalar types?:? (?P<expected>[\w, ]+); but got (?:torch\.)?(?P<found>\w+)",
    r"Found dtype (?P<found>\w+) but expected (?P<expected>\w+)",
    r"expected (?:m1|mat1) and (?:m2|mat2) to have the same dtype, but got: (?P<found>\w+) != (?P<expected>\w+)",
)


def dtype_advice(expected: str, found: str, is_target: bool) -> str:
    """The one-line cast that fixes a dtype mismatch, from the two dtype names in the message."""
    e, f = expected.lower(), found.lower()
    if is_target or "long" in e:
        return "class targets must be int64: `y = y.long()` (do it where the batch is unpacked)"
    if f in ("double", "float64", "doubletensor"):
        return ("the input is float64 (numpy's default): `x = x.float()`, or build it with "
                "`torch.from_numpy(a).float()` / `np.float32` arrays")
    if f in ("unsigned char", "byte", "uint8", "bytetensor"):
        return "the input is uint8 pixels: `x = x.float() / 255` (or use transforms.ToTensor())"
    if f in ("long", "int", "int64", "longtensor"):
        return "the input is an integer tensor: `x = x.float()` (for token ids use nn.Embedding)"
    if f in ("half", "bfloat16", "float16"):
        return ("half-precision input to a float32 model: run the forward under "
                "`torch.autocast(device_type, dtype=...)` instead of casting the input by hand")
    return f"cast the input to the parameters' dtype: `x = x.to({expected.lower()!s})`"


@register
class DtypeMismatch(CrashExplanation):
    """
    ## What it does
    Explains dtype errors ("expected scalar type Long but found Float", "mat1 and mat2 must
    have the same dtype", "Input type (double) and bias type (float) should be the same",
    "expected target dtype to be Long or Byte"): says which tensor has which dtype and gives
    the exact cast.

    ## Why is this bad?
    Model weights are float32; images from numpy are float64 or uint8, and class labels must
    be int64 for ``CrossEntropyLoss``/``NLLLoss`` (the usual cure: ``img = img.float(); label = label.long()``
    at the start of every batch).

    ## Example
    ```python
    x = torch.from_numpy(np.random.rand(8, 10))     # float64
    y = torch.tensor(labels, dtype=torch.float32)   # float labels
    loss = F.cross_entropy(model(x), y)
    ```

    ## Use instead
    ```python
    x, y = x.float(), y.long()
    ```

    ## References
    - PyTorch docs, ``CrossEntropyLoss`` (class-index targets are int64).
    """

    code = "E102"
    name = "dtype-mismatch"
    summary = "a tensor of the wrong dtype reached a layer or a loss"
    fix = "cast inputs to float32 (x.float()) and class targets to int64 (y.long())"
    patterns = _DTYPE_PATTERNS
    order = 40

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        expected = facts.get("expected", "?").strip()
        found = facts.get("found", "?").strip()
        is_target = "target" in crash.message or (
            crash.calls("cross_entropy", "functional") or crash.calls("nll_loss", "functional"))
        evidence: dict[str, Any] = {"expected": expected, "found": found}
        inputs = context_inputs(crash)
        if inputs:
            evidence["inputs"] = inputs
        params = crash.context.get("parameters") or {}
        if params:
            evidence["parameters"] = params
        role = "the target" if is_target else "a tensor"
        message = (f"{role[0].upper() + role[1:]} has dtype {found} where {expected} is required"
                   f"{module_phrase(crash)}.")
        return cls.make(crash, message, fix=dtype_advice(expected, found, is_target), evidence=evidence)


@register
class LongFloatCast(CrashExplanation):
    """
    ## What it does
    Explains "result type Float can't be cast to the desired output type Long": an in-place
    operation (``+=``, ``*=``, ``.add_()``, ``.mul_()``) on an integer tensor with a float
    result, or ``BCEWithLogitsLoss`` given integer targets.

    ## Why is this bad?
    In-place operations keep the left operand's dtype and refuse to truncate. Seed 002 hit it
    averaging two state_dicts: ``num_batches_tracked`` of every BatchNorm is int64, so
    ``sd[k] *= 0.5`` fails on it. Binary cross-entropy needs float targets.

    ## Example
    ```python
    for k in avg: avg[k] += other[k] * 0.5     # num_batches_tracked is int64
    F.binary_cross_entropy_with_logits(logits, labels)   # labels are int64
    ```

    ## Use instead
    ```python
    for k in avg:
        if avg[k].is_floating_point(): avg[k] += other[k] * 0.5
    F.binary_cross_entropy_with_logits(logits, labels.float())
    ```

    ## References
    - PyTorch docs, type promotion for in-place operations.
    """

    code = "E123"
    name = "long-float-cast"
    summary = "an in-place op on an integer tensor (or an integer BCE target) produced a float"
    fix = "skip integer tensors (t.is_floating_point()) or cast first; give BCE float targets"
    patterns = (r"result type (?P<result>\w+) can't be cast to the desired output type (?P<output>\w+)",)
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        result, output = facts.get("result", "Float"), facts.get("output", "Long")
        evidence: dict[str, Any] = {"result_type": result, "output_type": output}
        if crash.calls("binary_cross_entropy_with_logits") or crash.calls("binary_cross_entropy"):
            message = (f"Binary cross-entropy was given {output} (integer) targets; it computes in "
                       f"{result} and cannot write the result back into an integer tensor.")
            return cls.make(crash, message, fix="pass float targets: `loss_fn(logits, target.float())`",
                            evidence=evidence)
        frame = crash.user_frame
        text = line_text(frame.path, frame.line) if frame else ""
        target = _inplace_target(text)
        message = (f"An in-place operation wrote a {result} result into a {output} (integer) tensor"
                   + (f": `{text}`" if text else "") + ".")
        if target and crash.is_live:
            for name, value in live_objects(crash, lambda v: describe_tensor(v) is not None):
                if name == target.split("[")[0]:
                    evidence["tensor"] = f"{name}: {describe_tensor(value)}"
                    break
        if "num_batches_tracked" in crash.message or "state_dict" in text or "sd[" in text:
            message += " BatchNorm's num_batches_tracked buffer is int64."
        fix = (f"make `{target}` floating point first, or skip integer tensors "
               f"(`if t.is_floating_point(): ...`)") if target else cls.fix
        return cls.make(crash, message, fix=fix, evidence=evidence)


def _inplace_target(text: str) -> str | None:
    match = re.match(r"^\s*([\w.\[\]'\"]+)\s*(?:[-+*/]|//)=", text) or re.match(r"^\s*([\w.\[\]'\"]+)\.\w+_\(", text)
    return match.group(1) if match else None


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


_ASSERTIONS = (
    (r"t >= 0 && t < n_classes", "a class target outside [0, C) reached the loss (labels 1..C, or -1 padding)",
     "check the labels: `assert 0 <= y.min() and y.max() < num_classes`; shift 1-based labels with `y - 1`"),
    (r"srcIndex < srcSelectDimSize|index out of bounds|indexSelect",
     "an index outside the tensor's size (an embedding id ≥ num_embeddings, a gather/index_select index)",
     "check that token ids are < num_embeddings and indices are within the indexed dimension"),
    (r"input_val >= zero && input_val <= one",
     "BCELoss was given values outside [0, 1] (logits instead of probabilities)",
     "use BCEWithLogitsLoss on the logits, or apply sigmoid first"),
)


@register
class DeviceSideAssert(CrashExplanation):
    """
    ## What it does
    Explains "CUDA error: device-side assert triggered": finds the kernel's assertion in the
    log lines printed before the traceback (e.g. ``Assertion `t >= 0 && t < n_classes` failed``
    from the loss kernel) and turns it into the cause, and warns that the traceback's line may
    not be where the failure happened.

    ## Why is this bad?
    CUDA kernels report asynchronously: the Python error surfaces at a later call
    (``loss.item()``), and the CUDA context is unusable afterwards. The most frequent cause is
    a label out of range for the classifier (labels 1..C); next, an embedding index
    out of range, or probabilities outside [0, 1] for ``BCELoss``.

    ## Example
    ```python
    y = labels            # 1..10 for a 10-way output
    F.cross_entropy(model(x).cuda(), y.cuda())
    ```

    ## Use instead
    Run once on the CPU (``nndoctor run`` then explains the real error, E117), or with
    ``CUDA_LAUNCH_BLOCKING=1``; fix the labels (``y - 1``).

    ## References
    - Recorded message: tests/fixtures/crash/recorded/E109_device_side_assert.txt.
    - PyTorch notes, "CUDA semantics: asynchronous execution".
    """

    code = "E109"
    name = "device-side-assert"
    summary = "a CUDA kernel's assertion failed (usually a label or index out of range)"
    fix = "rerun with CUDA_LAUNCH_BLOCKING=1 or on the CPU to see the real error; check label and index ranges"
    patterns = (r"device-side assert triggered", r"cudaErrorAssert")
    order = 10

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {}
        assertion = re.search(r"Assertion `([^`]+)` failed", crash.text)
        cause, fix = None, cls.fix
        if assertion:
            evidence["kernel_assertion"] = assertion.group(1)
            kernel = re.search(r"(\w+_kernel\w*)", crash.text)
            if kernel:
                evidence["kernel"] = kernel.group(1)
            for pattern, meaning, advice in _ASSERTIONS:
                if re.search(pattern, assertion.group(1)):
                    cause, fix = meaning, advice + " (confirm on the CPU or with CUDA_LAUNCH_BLOCKING=1)"
                    break
        message = "A CUDA kernel's assertion failed"
        message += f": {cause}." if cause else " (the kernel's message is not in this text)."
        message += (" CUDA reports errors asynchronously, so the line shown may be a later call"
                    " than the one that failed.")
        return cls.make(crash, message, fix=fix, evidence=evidence)


@register
class InvalidDeviceOrdinal(CrashExplanation):
    """
    ## What it does
    Explains "CUDA error: invalid device ordinal": the code asked for ``cuda:N`` where N is
    not smaller than the number of GPUs this process can see; shows that number and
    ``CUDA_VISIBLE_DEVICES``.

    ## Why is this bad?
    ``CUDA_VISIBLE_DEVICES=2`` renumbers the visible GPU as ``cuda:0``; scripts written for a
    multi-GPU box (``cuda:1``, ``device_ids=[0, 1, 2, 3]``) or a checkpoint loaded with its
    saved ``cuda:3`` location fail on a smaller one.

    ## Example
    ```python
    device = torch.device("cuda:1")   # under CUDA_VISIBLE_DEVICES=1 only cuda:0 exists
    ```

    ## Use instead
    ```python
    device = torch.device("cuda")     # and choose the GPU with CUDA_VISIBLE_DEVICES
    torch.load(path, map_location=device)
    ```

    ## References
    - Recorded message: tests/fixtures/crash/recorded/E120_invalid_device_ordinal.txt.
    """

    code = "E120"
    name = "invalid-device-ordinal"
    summary = "a GPU index beyond the GPUs this process can see"
    fix = "use torch.device('cuda') and select GPUs with CUDA_VISIBLE_DEVICES; load checkpoints with map_location"
    patterns = (r"invalid device ordinal", r"CUDA_ERROR_INVALID_DEVICE", r"Invalid device id")
    order = 10

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {}
        frame = crash.user_frame
        text = line_text(frame.path, frame.line) if frame else ""
        text = text or (frame.source if frame else "")
        asked = re.findall(r"cuda:(\d+)|device_ids\s*=\s*\[([\d, ]+)\]|set_device\((\d+)\)", text)
        if text:
            evidence["line"] = text
        if crash.is_live:
            try:
                import torch

                evidence["visible_gpus"] = torch.cuda.device_count()
            except Exception:  # noqa: BLE001
                pass
            evidence["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
        message = "The code asked for a GPU index that does not exist in this process"
        if "visible_gpus" in evidence:
            message += f": {evidence['visible_gpus']} GPU(s) visible, so valid indices are 0..{max(0, evidence['visible_gpus'] - 1)}"
        if asked:
            message += f" (the line asks for {', '.join(a for group in asked for a in group if a)})"
        message += ". GPU numbers are renumbered from 0 under CUDA_VISIBLE_DEVICES."
        return cls.make(crash, message, evidence=evidence)


@register
class CudnnFailure(CrashExplanation):
    """
    ## What it does
    Explains cuDNN failures: ``CUDNN_STATUS_INTERNAL_ERROR``, ``CUDNN_STATUS_NOT_SUPPORTED``,
    ``CUDNN_STATUS_EXECUTION_FAILED``, "Unable to find a valid cuDNN algorithm", "Failed to
    get convolution algorithm".

    ## Why is this bad?
    These messages rarely mean a cuDNN bug. Most often the GPU is (almost) out of memory
    when cuDNN allocates its workspace, or another process holds the card ; next, a CUDA/cuDNN/driver
    mismatch, or an input cuDNN does not support (non-contiguous, huge).

    ## Example
    ```python
    out = model(x)    # RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR
    ```

    ## Use instead
    Reduce the batch size and check ``nvidia-smi`` for other processes; confirm with
    ``torch.backends.cudnn.enabled = False`` (if it then runs, or raises out-of-memory, the
    input/memory is the cause); check that torch's CUDA build matches the driver.

    ## References
    - pytorch/pytorch#45769 (quoted message; not reproduced, see tests/fixtures/crash/recorded/README.md).
    """

    code = "E121"
    name = "cudnn-failure"
    summary = "cuDNN failed (usually memory pressure or a version mismatch)"
    fix = ("reduce the batch size and free the GPU; test with torch.backends.cudnn.enabled = False; "
           "check that the CUDA build of torch matches the driver")
    patterns = (r"CUDNN_STATUS_(?P<status>[A-Z_]+)", r"Unable to find a valid cuDNN algorithm",
                r"Failed to get convolution algorithm", r"cuDNN error", r"GET was unable to find an engine")
    order = 20

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        status = facts.get("status")
        evidence: dict[str, Any] = {"status": f"CUDNN_STATUS_{status}"} if status else {}
        inputs = context_inputs(crash)
        if inputs:
            evidence["inputs"] = inputs
        message = f"cuDNN failed{module_phrase(crash)}" + (f" with CUDNN_STATUS_{status}" if status else "") + "."
        if status == "NOT_SUPPORTED":
            message += " cuDNN does not support this input (often a non-contiguous or very large tensor)."
        else:
            message += " This is most often memory pressure (cuDNN's workspace does not fit) or a CUDA/cuDNN/driver mismatch."
        return cls.make(crash, message, evidence=evidence)
