"""Explanations of dtype crashes: E102 (an operation got the wrong dtype) and E123 (an integer
tensor updated in place with floating-point values)."""

from __future__ import annotations

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
from nndoctor.commands.explain.source import line_text
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register

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
    In-place operations keep the left operand's dtype and refuse to truncate. A common case:
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
