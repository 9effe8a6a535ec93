"""P115 tf32-disabled: float32 matmuls/convolutions on a TF32-capable GPU with TF32 off (info).

A ``perf``-scope check: ``nndoctor perf`` knows the device and how the model ran; the
decision is the pure ``tf32_off_ops`` below, unit-tested with fake device capabilities.
"""

from __future__ import annotations

from typing import Any

import torch

from nndoctor.core.findings import Finding, Severity
from nndoctor.core.registry import Check, register

TF32_CAPABILITY = (8, 0)  # Ampere and newer have TF32 tensor cores


def tf32_flags() -> tuple[bool, bool]:
    """(matmuls may use TF32, cuDNN convolutions may use TF32), from the process's settings."""
    matmul = getattr(torch.backends.cuda.matmul, "fp32_precision", "none")
    if matmul in ("tf32",):
        matmul_tf32 = True
    elif matmul == "ieee":
        matmul_tf32 = False
    else:
        matmul_tf32 = torch.get_float32_matmul_precision() in ("high", "medium")
    conv = getattr(torch.backends.cudnn, "fp32_precision", "none")
    conv_tf32 = conv == "tf32" or (conv == "none" and bool(torch.backends.cudnn.allow_tf32))
    return matmul_tf32, conv_tf32


def tf32_off_ops(device: str, capability: tuple[int, int] | None, param_dtype: str, autocast: bool,
                 has_conv: bool, matmul_tf32: bool, conv_tf32: bool) -> list[str]:
    """The kinds of float32 operations that run without TF32 on a TF32-capable GPU."""
    if device != "cuda" or capability is None or tuple(capability) < TF32_CAPABILITY:
        return []
    if param_dtype != "float32" or autocast:
        return []
    off = []
    if not matmul_tf32:
        off.append("matmul")
    if has_conv and not conv_tf32:
        off.append("convolution")
    return off


@register
class Tf32Disabled(Check):
    """
    ## What it does
    In ``nndoctor perf``, when the model trains in float32 without autocast on a GPU with
    TF32 tensor cores (compute capability ≥ 8.0: A100, H100, RTX 30xx and newer), reads
    the process's TF32 settings and reports the operation kinds that run in full float32:
    matrix multiplications while ``torch.get_float32_matmul_precision()`` is ``"highest"``
    (PyTorch's default), convolutions when ``torch.backends.cudnn.allow_tf32`` was turned
    off. Information only: TF32 changes numerics slightly (10-bit mantissa inputs, float32
    accumulation).

    ## Why is this bad?
    On these GPUs float32 matmuls without TF32 run on the ordinary FP32 units, several
    times slower than TF32 tensor cores (NVIDIA quotes up to 8× on A100 for TF32 vs FP32
    peak throughput). PyTorch keeps TF32 off for matmuls by default for precision, so a
    float32 training script leaves most of an A100/H100's matmul throughput unused.

    ## Example
    ```python
    model = Transformer().cuda()             # float32, no autocast, default settings
    ```

    ## Use instead
    ```python
    torch.set_float32_matmul_precision("high")     # TF32 for float32 matmuls
    torch.backends.cudnn.allow_tf32 = True         # (the default) TF32 for convolutions
    ```
    or train with ``torch.autocast(device_type="cuda", dtype=torch.bfloat16)`` (P105), which
    is faster still. No threshold: the settings and the device decide; the gain is not
    measured by ``--try`` yet, hence info.

    ## References
    - PyTorch docs, "TensorFloat-32 (TF32) on Ampere (and later) devices": https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices
    - PyTorch docs, ``torch.set_float32_matmul_precision``: https://pytorch.org/docs/stable/generated/torch.set_float32_matmul_precision.html
    - NVIDIA, "TensorFloat-32 in the A100 GPU Accelerates AI Training, HPC up to 20x": https://blogs.nvidia.com/blog/tensorfloat-32-precision-format/
    """

    code = "P115"
    name = "tf32-disabled"
    severity = Severity.INFO
    summary = "fp32 matmul/conv on a tensor-core GPU with TF32 off — info"
    fix = 'torch.set_float32_matmul_precision("high") (and keep torch.backends.cudnn.allow_tf32 = True)'
    scope = "perf"


def tf32_findings(result: Any) -> list[Finding]:
    """P115 for a finished ``PerfResult`` (device, facts); empty when it does not apply."""
    facts, device = result.facts, result.device
    matmul_tf32, conv_tf32 = tf32_flags()
    off = tf32_off_ops(facts.device, device.capability, facts.param_dtype, facts.autocast,
                       facts.has_conv, matmul_tf32, conv_tf32)
    if not off:
        return []
    capability = device.capability
    return [Tf32Disabled.finding(
        f"float32 {' and '.join(off)}s run without TF32 on {device.name} (compute capability "
        f"{capability[0]}.{capability[1]}, TF32 tensor cores): float32 matmul precision is "
        f"'{torch.get_float32_matmul_precision()}', cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}",
        location=facts.forward_location,
        evidence={"ops_without_tf32": off, "matmul_precision": torch.get_float32_matmul_precision(),
                  "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32), "param_dtype": facts.param_dtype},
    )]
