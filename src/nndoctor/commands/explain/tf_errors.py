"""TensorFlow's wording of causes the catalog already explains for PyTorch: out of memory
(E108), a class label outside [0, C) (E117), a matrix multiply whose inner sizes differ (E105).

Each is a ``variant`` of the PyTorch explanation's code: same cause, same code, one catalog
entry; the facts come from TensorFlow's message (the node names the layer through its name
scopes) and, in a live run, from the frames' locals.
"""

from __future__ import annotations

import re
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation, variant
from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.tf_text import layer_from_node, node_name, op_name
from nndoctor.core.findings import Finding

_DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
                "int32": 4, "int64": 8, "int8": 1, "uint8": 1, "bool": 1, "int16": 2, "complex64": 8}


def _gib(value: float) -> str:
    if value >= 2**40:
        return f"{value / 2**40:.1f} TiB"
    return f"{value / 2**30:.2f} GiB" if value >= 2**28 else f"{value / 2**20:.1f} MiB"


def tensor_bytes(shape: list[int], dtype: str) -> int | None:
    size = _DTYPE_BYTES.get(dtype.lower())
    if size is None:
        return None
    for dim in shape:
        size *= dim
    return size


def _layer_phrase(crash: Crash) -> str:
    layer = layer_from_node(node_name(crash.text))
    return f" in '{layer}'" if layer else ""


@variant
class TensorFlowOutOfMemory(CrashExplanation):
    """
    ## What it does
    TensorFlow: explains ``ResourceExhaustedError: OOM when allocating tensor with
    shape[…] and type float on …GPU:0 by allocator GPU_0_bfc`` — the size of the tensor that
    did not fit, the device (GPU or host memory), the layer from the failing node's name scopes,
    and the allocator's limit and use when the log prints its statistics.

    ## References
    - TensorFlow guide, "Use a GPU" (memory growth, limiting GPU memory): https://www.tensorflow.org/guide/gpu
    - Keras mixed precision guide: https://keras.io/api/mixed_precision/
    - tensorflow/models#7142, zzw922cn/Automatic_Speech_Recognition#78 (OOM reports).
    """

    code = "E108"
    name = "out-of-memory"
    summary = "TensorFlow ran out of GPU or host memory"
    fix = ("reduce the batch size (the first axis of the tensor is usually the batch); use mixed precision "
           "(keras.mixed_precision.set_global_policy('mixed_float16')); free other processes on the GPU")
    patterns = (r"OOM when allocating tensor (?:with|of) shape\s*\[(?P<shape>[\d, ]*)\](?: and type (?P<dtype>\w+))?"
                r"(?: on (?P<device>\S+?))?(?: by allocator (?P<allocator>\w+))?(?=[\s.\[]|$)",
                r"(?P<plain>(?:ResourceExhaustedError|Resource exhausted|RESOURCE_EXHAUSTED)\b.{0,300}?\bOOM\b)")
    order = 10

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {}
        layer = _layer_phrase(crash)
        if "shape" in facts:
            shape = [int(p) for p in re.split(r"[,\s]+", facts["shape"].strip()) if p]
            dtype = facts.get("dtype") or "float"
            device = facts.get("device") or ""
            on_gpu = "GPU" in device.upper() or "gpu" in (facts.get("allocator") or "").lower()
            evidence.update({"tensor_shape": shape, "dtype": dtype, "device": device or None})
            size = tensor_bytes(shape, dtype)
            where = "GPU memory" if on_gpu else ("host memory (RAM)" if device else "memory")
            message = f"TensorFlow ran out of {where} allocating a {dtype} tensor of shape {shape}"
            if size is not None:
                evidence["tensor_bytes"] = size
                message += f" ({_gib(size)})"
            message += f"{layer}."
        else:
            on_gpu = "GPU" in crash.text
            message = f"TensorFlow ran out of {'GPU ' if on_gpu else ''}memory{layer}."
        limit = re.search(r"^\s*Limit:\s+(\d+)", crash.text, re.M)
        in_use = re.search(r"^\s*InUse:\s+(\d+)", crash.text, re.M)
        if limit and in_use:
            evidence["allocator_limit"], evidence["allocator_in_use"] = int(limit.group(1)), int(in_use.group(1))
            message += (f" The allocator's limit is {_gib(int(limit.group(1)))} and {_gib(int(in_use.group(1)))} "
                        "were in use.")
        if evidence.get("tensor_shape") and len(evidence["tensor_shape"]) >= 2:
            message += (f" Its first axis ({evidence['tensor_shape'][0]}) is usually the batch: the memory an "
                        "activation needs grows with it.")
        fix = cls.fix
        if evidence.get("device") and not on_gpu:
            fix = ("reduce the batch size (the first axis of the tensor is usually the batch) or the tensor's size: "
                   "this allocation was in host memory (RAM)")
        return cls.make(crash, message, fix=fix, evidence=evidence)


def tf_label_cause(label: int, classes: int, values: list[int]) -> tuple[str, str]:
    """(cause, fix) for a label outside [0, classes) in a sparse cross-entropy (pure)."""
    low = min(values + [label])
    high = max(values + [label])
    if low < 0:
        return (f"the labels contain {low}: TensorFlow's sparse cross-entropy has no ignore index, so a "
                "negative 'padding' or 'unknown' label cannot reach it",
                f"drop or mask the samples labelled {low} (filter them, or give them sample_weight 0 and a valid label)")
    if low == 1 and high == classes:
        return (f"the labels run from {low} to {high}: they are 1-based, but class indices must be 0..{classes - 1}",
                "subtract 1 from the labels (`y = y - 1`) where the dataset builds them")
    if high == classes:
        return (f"label {high} equals the number of outputs ({classes}): the output layer is one class short, "
                "or the labels are numbered from 1",
                f"give the output layer {classes + 1} units if there are {classes + 1} classes (a vocabulary or class "
                "list built one entry short), else shift 1-based labels (`y - 1`)")
    return (f"the model outputs {classes} classes (valid labels 0..{classes - 1}) but the labels go up to {high}",
            f"give the output layer {high + 1} units (`Dense({high + 1})`) if there are {high + 1} classes, "
            f"or remap the labels to 0..{classes - 1}")


@variant
class TensorFlowLabelOutOfRange(CrashExplanation):
    """
    ## What it does
    TensorFlow/Keras: explains "Received a label value of 10 which is outside the valid range
    of [0, 10)" from ``sparse_categorical_crossentropy`` / ``SparseSoftmaxCrossEntropyWithLogits``:
    from the label values TensorFlow prints, says whether the labels are 1-based, contain a
    negative marker, or the output layer has fewer units than there are classes.

    ## References
    - Keras docs, `SparseCategoricalCrossentropy` (integer labels 0..C-1): https://keras.io/api/losses/probabilistic_losses/#sparsecategoricalcrossentropy-class
    - TensorFlow docs, `tf.nn.sparse_softmax_cross_entropy_with_logits`: https://www.tensorflow.org/api_docs/python/tf/nn/sparse_softmax_cross_entropy_with_logits
    """

    code = "E117"
    name = "target-out-of-bounds"
    summary = "a label outside [0, C) reached TensorFlow's sparse cross-entropy"
    fix = "labels must be 0..C-1: shift 1-based labels (y - 1) or give the output layer one unit per class"
    patterns = (r"Received a label value of (?P<label>-?\d+) which is outside the valid range of \[0, (?P<classes>\d+)\)"
                r"(?:\.\s+Label values:(?P<values>[-\d \n]*))?",)
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        label, classes = int(facts["label"]), int(facts["classes"])
        values = [int(v) for v in (facts.get("values") or "").split()][:100000]
        cause, fix = tf_label_cause(label, classes, values)
        evidence: dict[str, Any] = {"label": label, "classes": classes}
        if values:
            evidence["batch_label_range"] = [min(values), max(values)]
        layer = layer_from_node(node_name(crash.text))
        if layer:
            evidence["node_scope"] = layer
        message = f"The loss received label {label}: {cause}."
        return cls.make(crash, message, fix=fix, evidence=evidence)


@variant
class TensorFlowMatmulMismatch(CrashExplanation):
    """
    ## What it does
    TensorFlow: explains "Matrix size-incompatible: In[0]: [4,784], In[1]: [512,10]" — a
    matrix multiply (a Dense layer or ``tf.matmul``) whose input has another number of
    features than its weight has rows; names the layer from the node's name scopes.

    ## References
    - TensorFlow docs, `tf.linalg.matmul` (inner dimensions must agree): https://www.tensorflow.org/api_docs/python/tf/linalg/matmul
    """

    code = "E105"
    name = "linear-shape-mismatch"
    summary = "a TensorFlow matmul got inputs whose inner sizes differ"
    fix = "make the input's feature count equal to the weight's rows (flatten before it, or build the layer for the data)"
    patterns = (r"Matrix size-incompatible: In\[0\]: \[(?P<r1>\d+),\s*(?P<c1>\d+)\], In\[1\]: \[(?P<r2>\d+),\s*(?P<c2>\d+)\]",)
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        rows, got, expected, out = (int(facts[k]) for k in ("r1", "c1", "r2", "c2"))
        evidence = {"input_shape": [rows, got], "weight_shape": [expected, out], "op": op_name(crash.text)}
        layer = layer_from_node(node_name(crash.text))
        subject = f"The matrix multiply in '{layer}'" if layer else "A matrix multiply"
        message = (f"{subject} received {got} features per row for a weight of {expected}×{out}: the input "
                   f"[{rows}, {got}] needs {expected} columns.")
        if got > expected and got % expected == 0:
            message += (f" {got} = {expected} × {got // expected}: the input may hold several samples' or "
                        "positions' features side by side (reshape or pooling missing).")
        fix = f"give the input {expected} features (flatten/pool before it), or build the weight as [{got}, {out}]"
        return cls.make(crash, message, fix=fix, evidence={k: v for k, v in evidence.items() if v is not None})
