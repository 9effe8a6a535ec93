"""Explanations of autograd crashes: E110 backward twice, E111 in-place modification, E112 no
grad_fn, E125 ambiguous tensor truth value."""

from __future__ import annotations

import ast
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation
from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.source import no_grad_block_around, statement_at, strip_comment
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register


@register
class BackwardTwice(CrashExplanation):
    """
    ## What it does
    Explains "Trying to backward through the graph a second time": says how many backward
    passes ran since the last optimizer step and lists the usual culprits.

    ## Why is this bad?
    ``backward()`` frees the graph's saved tensors. A second backward through any part of
    the same graph fails: a loss backpropagated twice, a tensor computed once outside the
    loop (a fixed embedding, an RNN's hidden state carried across batches) reused every
    iteration, or a GAN's generator output used for the discriminator and the generator.
    ``retain_graph=True`` hides the symptom and leaks memory.

    ## Example
    ```python
    hidden = model.init_hidden()
    for x, y in loader:
        out, hidden = model(x, hidden)     # hidden carries last batch's graph
        loss_fn(out, y).backward()
    ```

    ## Use instead
    ```python
        out, hidden = model(x, hidden.detach())
    ```
    GANs: ``D(fake.detach())`` for the discriminator step.

    ## References
    - PyTorch autograd notes, "Saved tensors".
    """

    code = "E110"
    name = "backward-twice"
    summary = "backward ran through a graph whose saved tensors were already freed"
    fix = ("detach tensors carried across iterations (hidden = hidden.detach(); D(fake.detach())); "
           "call backward once per graph — retain_graph=True only if you really need two passes")
    patterns = (r"Trying to backward through the graph a second time",)
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {}
        message = "backward() reached part of a graph that an earlier backward() had already freed."
        session = crash.session
        if session is not None:
            state = session.state
            evidence["backwards_since_last_step"] = state.backwards_since_step
            evidence["optimizer_steps"] = session.step
            if state.backwards_since_step >= 2:
                message += (f" This was backward call {state.backwards_since_step} since the last optimizer step:"
                            " the same loss (or a tensor shared by both losses) was backpropagated again.")
            elif session.step >= 1:
                message += (f" It failed after {session.step} optimizer step(s): a tensor computed in an"
                            " earlier iteration (a hidden state, a cached feature) is reused without .detach().")
        return cls.make(crash, message, evidence=evidence)


@register
class InplaceModified(CrashExplanation):
    """
    ## What it does
    Explains "one of the variables needed for gradient computation has been modified by an
    inplace operation": names the tensor (shape, the operation that produced it, its version
    counter) and lists the in-place modules of the model (``ReLU(inplace=True)``).

    ## Why is this bad?
    Autograd saved the tensor to compute a gradient; an in-place operation (``x += 1``,
    ``x[mask] = 0``, ``relu_``, ``ReLU(inplace=True)`` after an op that saves its output,
    ``sigmoid``/``tanh``) changed it before backward ran.

    ## Example
    ```python
    y = torch.sigmoid(x)
    y *= mask                 # sigmoid's backward needs the original y
    ```

    ## Use instead
    ```python
    y = torch.sigmoid(x) * mask
    ```
    To find the operation: ``torch.autograd.set_detect_anomaly(True)`` for one step.

    ## References
    - PyTorch autograd notes, "In-place operations with autograd".
    """

    code = "E111"
    name = "inplace-modified"
    summary = "a tensor saved for backward was modified in place"
    fix = ("replace the in-place operation with an out-of-place one (y = y * m instead of y *= m; "
           "inplace=False); find it with torch.autograd.set_detect_anomaly(True)")
    patterns = (
        r"modified by an inplace operation: \[(?P<tensor>[^\]]*\[[\d, ]*\])\](?:, which is output (?P<output>\d+) of (?P<op>\w+),)? is at version (?P<version>\d+); expected version (?P<expected>\d+)",
        r"modified by an inplace operation",
    )
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {k: facts[k] for k in ("tensor", "op", "version", "expected") if k in facts}
        op = facts.get("op")
        message = "A tensor that autograd saved for the backward pass was modified in place before backward ran"
        if "tensor" in facts:
            message += f": {facts['tensor']}"
            if op:
                message += f", the output of {op.removesuffix('Backward0').removesuffix('Backward1')}"
            if "version" in facts:
                changes = int(facts["version"]) - int(facts.get("expected", 0))
                message += f", was changed {changes} time(s) after it was saved"
        message += "."
        inplace = _inplace_modules(crash)
        if inplace:
            evidence["inplace_modules"] = inplace[:8]
            message += f" In-place modules in the model: {', '.join(inplace[:4])}."
        return cls.make(crash, message, evidence=evidence)


def _inplace_modules(crash: Crash) -> list[str]:
    state = crash.session.state if crash.session is not None else None
    if state is None:
        return []
    names: list[str] = []
    for root in list(state.roots):
        for name, module in root.named_modules():
            if getattr(module, "inplace", False) is True:
                names.append(f"{name or type(root).__name__} ({type(module).__name__})")
    return names


@register
class NoGradFn(CrashExplanation):
    """
    ## What it does
    Explains "element 0 of tensors does not require grad and does not have a grad_fn": checks
    whether the failing ``backward()`` sits inside ``with torch.no_grad()`` /
    ``inference_mode()``, and whether the models' parameters are all frozen.

    ## Why is this bad?
    The loss is not connected to any trainable parameter: it was computed under
    ``no_grad``, through ``.detach()``/``.item()``/``.numpy()`` or ``torch.tensor(loss)``, or
    every parameter has ``requires_grad=False`` (a frozen backbone whose new head was not
    added).

    ## Example
    ```python
    with torch.no_grad():
        loss = criterion(model(x), y)
    loss.backward()
    ```

    ## Use instead
    ```python
    loss = criterion(model(x), y)     # outside no_grad
    loss.backward()
    ```

    ## References
    - PyTorch docs, "Locally disabling gradient computation".
    """

    code = "E112"
    name = "no-grad-fn"
    summary = "backward() on a tensor not connected to any parameter that requires grad"
    fix = ("compute the loss outside torch.no_grad()/inference_mode, without .detach()/.item()/torch.tensor(); "
           "make sure some parameters have requires_grad=True")
    patterns = (r"element 0 of tensors does not require grad and does not have a grad_fn",)
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {}
        message = "backward() was called on a tensor that is not connected to any parameter requiring gradients."
        fix = cls.fix
        frame = crash.user_frame
        if frame is not None and frame.line:
            block = no_grad_block_around(frame.path, frame.line)
            if block is not None:
                evidence["no_grad_block_line"] = block
                message += f" The backward() call is inside the `with` block at line {block} (no_grad/inference_mode)."
                fix = f"move the loss computation and backward() out of the no_grad block at line {block}"
        state = crash.session.state if crash.session is not None else None
        if state is not None:
            for root in list(state.roots):
                params = list(root.parameters())
                trainable = sum(1 for p in params if p.requires_grad)
                evidence[f"{type(root).__name__}_trainable_params"] = f"{trainable}/{len(params)}"
                if params and trainable == 0:
                    message += f" Every parameter of {type(root).__name__} has requires_grad=False (all frozen)."
                    fix = "unfreeze the layers to train (p.requires_grad_(True)), e.g. the new head"
        return cls.make(crash, message, fix=fix, evidence=evidence)


def truth_value_use(statement: ast.stmt | None) -> str | None:
    """What on the line asks a tensor for a single truth value (pure, from the AST)."""
    if statement is None:
        return None
    if isinstance(statement, (ast.If, ast.While)):
        return "an `if`/`while` condition"
    if isinstance(statement, ast.Assert):
        return "an `assert`"
    for node in ast.walk(statement):
        if isinstance(node, ast.BoolOp):
            return "`and`/`or` between tensors"
        if isinstance(node, ast.IfExp):
            return "a conditional expression (`a if cond else b`)"
        if isinstance(node, ast.Compare) and len(node.ops) > 1:
            return "a chained comparison (`a < x < b`)"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("max", "min", "sorted", "any", "all"):
            return f"Python's built-in `{node.func.id}()`"
    return None


@register
class AmbiguousTensorBool(CrashExplanation):
    """
    ## What it does
    Explains "Boolean value of Tensor with more than one value is ambiguous": finds what on
    the failing line asked for a truth value (``if``, ``and``/``or``, a chained comparison,
    Python's ``max``) and recognises tensors passed to a loss class's constructor
    (``nn.CrossEntropyLoss(out, y)``).

    ## Why is this bad?
    ``if mask:`` or ``a and b`` needs one boolean; a tensor of many elements has none.
    ``nn.CrossEntropyLoss(output, target)`` passes the tensors as ``weight`` and
    ``size_average`` to the constructor instead of computing a loss.

    ## Example
    ```python
    if pred == y: correct += 1
    loss = nn.CrossEntropyLoss(out, y)
    ```

    ## Use instead
    ```python
    correct += (pred == y).sum().item()
    loss = nn.CrossEntropyLoss()(out, y)     # build once: criterion = nn.CrossEntropyLoss()
    ```

    ## References
    - PyTorch docs, ``torch.Tensor.any``/``all``, ``torch.logical_and``.
    """

    code = "E125"
    name = "ambiguous-tensor-bool"
    summary = "a multi-element tensor used where Python needs one True/False"
    fix = "reduce explicitly: (a == b).all() / .any() / .sum(); use & and | instead of and/or"
    patterns = (r"Boolean value of Tensor with more than (?:one|\d+) values? is ambiguous",
                r"The truth value of an array with more than one element is ambiguous")
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {}
        frame = crash.user_frame
        if crash.calls("__init__", "loss.py") or crash.calls("legacy_get_string", "_reduction"):
            message = ("Tensors were passed to a loss class's constructor: `nn.CrossEntropyLoss(output, target)` "
                       "treats them as its weight/size_average options instead of computing the loss.")
            fix = "build the loss once and call it: `criterion = nn.CrossEntropyLoss()` then `criterion(output, target)`"
            return cls.make(crash, message, fix=fix, evidence=evidence)
        use = truth_value_use(statement_at(frame.path, frame.line)) if frame and frame.line else None
        source = strip_comment(frame.source) if frame else ""
        if source:
            evidence["line"] = source
        message = "A tensor with more than one element was used where Python needs a single True/False"
        message += f": {use}" + (f" in `{source}`" if source else "") + "." if use else "."
        fix = cls.fix
        if use and "and" in use:
            fix = "use element-wise `&` / `|` (with parentheses) instead of `and` / `or`"
        elif use and "built-in" in use:
            fix = "use torch.max / torch.min (or tensor.max()) instead of Python's built-ins on tensors"
        return cls.make(crash, message, fix=fix, evidence=evidence)

