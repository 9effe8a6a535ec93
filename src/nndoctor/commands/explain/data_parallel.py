"""P107 as a log shows it: the warning ``nn.DataParallel``'s gather prints when the replicas
return scalars (a loss computed inside ``forward``). The run check (``perf/run_checks.py``)
owns the code."""

from __future__ import annotations

from typing import Any

from nndoctor.commands.explain.base import CrashExplanation, variant
from nndoctor.commands.explain.crash import Crash
from nndoctor.core.findings import Finding, Severity

# torch/nn/parallel/_functions.py (Gather.forward): the message, and the source line Python's
# warnings module echoes under it ("  warnings.warn('Was asked to gather along dimension 0, but all '").
_GATHER = r"Was asked to gather along dimension 0, but all"


@variant
class DataParallelGatherWarning(CrashExplanation):
    """
    ## What it does
    From a log: reports PyTorch's warning "Was asked to gather along dimension 0, but all input
    tensors were scalars; will instead unsqueeze and return a vector", which only
    ``nn.DataParallel``'s gather prints, and only over two or more GPUs (over one, DataParallel
    calls the model directly). The warning itself is harmless (each replica's scalar loss
    becomes one element of a vector); what it shows is that training runs under DataParallel.
    Hugging Face's ``Trainer`` and Lightning's ``dp`` strategy use DataParallel when a script
    started with ``python`` sees several GPUs.

    ## References
    - PyTorch source, the warning (torch/nn/parallel/_functions.py, ``Gather``): https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/_functions.py
    - huggingface/transformers issue #14128 (the answer: launch the Trainer script with torchrun): https://github.com/huggingface/transformers/issues/14128
    """

    code = "P107"
    name = "dataparallel-in-use"
    severity = Severity.WARNING
    summary = "nn.DataParallel instead of DistributedDataParallel"
    fix = ("launch with torchrun --nproc_per_node=<GPUs> (DistributedDataParallel: one process per GPU); "
           "Hugging Face's Trainer and Accelerate switch to it by themselves under torchrun or accelerate launch")
    patterns = (_GATHER,)
    warning_lines = (_GATHER,)
    preamble_evidence = False
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        message = ("nn.DataParallel gathered the scalar outputs (typically the loss) of its replicas on two or more "
                   "GPUs, so training runs under DataParallel: one Python process that copies the model to every GPU "
                   "on every forward and gathers the outputs on the first GPU, slower than DistributedDataParallel "
                   "and, for small models, than one GPU. The warning itself is harmless.")
        return cls.make(crash, message, evidence={"wrapper": "torch.nn.DataParallel"})
