"""P115 as a log shows it: Lightning's note that the GPU has TF32 tensor cores while float32
matrix multiplications run at PyTorch's default "highest" precision. The perf check
(``checks/tf32.py``) owns the code."""

from __future__ import annotations

from typing import Any

from nndoctor.commands.explain.base import CrashExplanation, variant
from nndoctor.commands.explain.crash import Crash
from nndoctor.core.findings import Finding, Severity


@variant
class TensorCoresNote(CrashExplanation):
    """
    ## What it does
    From a log: reports Lightning's note "You are using a CUDA device ('NVIDIA A40') that has
    Tensor Cores. To properly utilize them, you should set
    `torch.set_float32_matmul_precision('medium' | 'high')`", which Lightning prints when the GPU
    is an Ampere or newer one and ``torch.get_float32_matmul_precision()`` is still
    ``"highest"``. A log that also shows Lightning training in 16-bit or bfloat16 precision
    ("Using bfloat16 Automatic Mixed Precision (AMP)") is left alone: its matmuls do not run in
    float32.

    ## References
    - Lightning source, the note (lightning/fabric/accelerators/cuda.py, ``_check_cuda_matmul_precision``): https://github.com/Lightning-AI/pytorch-lightning/blob/master/src/lightning/fabric/accelerators/cuda.py
    - tensorpix/benchmarking-cv-models issue #8 (vit_l_16 in float32: 47 img/s at "highest", 94 img/s at "high"): https://github.com/tensorpix/benchmarking-cv-models/issues/8
    """

    code = "P115"
    name = "tf32-disabled"
    severity = Severity.INFO
    summary = "fp32 matmul/conv on a tensor-core GPU with TF32 off — info"
    fix = 'torch.set_float32_matmul_precision("high") (and keep torch.backends.cudnn.allow_tf32 = True)'
    # Lightning's wording since 1.8 (the device's name is left out in some pastes).
    patterns = (r"You are using a CUDA device (?:\('(?P<device>[^'\n]*)'\) )?that has Tensor Cores\.",)
    warning_lines = (r"You are using a CUDA device (?:\('[^'\n]*'\) )?that has Tensor Cores\.",)
    # Lightning's own line for a 16-bit run: the note is printed all the same, but the matmuls
    # then run in float16/bfloat16 and TF32 does not apply to them.
    log_contradictions = (r"Using (?:bfloat16|16bit|16-bit|bf16|fp16)\b[^\n]*(?:Mixed Precision|precision)",)
    preamble_evidence = False
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        device = f" ({facts['device']})" if facts.get("device") else ""
        message = (f"The GPU{device} has TF32 tensor cores, but float32 matrix multiplications run at PyTorch's default "
                   "'highest' precision, which keeps them off: a model trained in float32 leaves most of the GPU's "
                   "matmul throughput unused. TF32 rounds the inputs to a 10-bit mantissa and accumulates in float32.")
        evidence = {"matmul_precision": "highest"}
        if facts.get("device"):
            evidence["device"] = facts["device"]
        return cls.make(crash, message, evidence=evidence)
