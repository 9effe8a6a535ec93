"""Explanations of device crashes: E101 (tensors on different devices) and the CUDA-only E109
(device-side assert), E120 (invalid device ordinal), E121 (cuDNN failure).

dtype crashes are in ``dtypes``, out-of-memory in ``memory``.
"""

from __future__ import annotations

import os
import re
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation
from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.evidence import (
    context_inputs,
    describe_tensor,
    live_objects,
    module_phrase,
)
from nndoctor.commands.explain.source import discarded_moves, line_text
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register


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
