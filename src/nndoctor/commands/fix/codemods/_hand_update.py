"""Hand-written update loops (no torch.optim): where O101/O102's codemods find the update.

The update is a ``for P in ITERABLE:`` loop whose body reads ``P.grad`` and writes ``P``
(``P -= lr * P.grad``, ``P.data.add_(-lr * P.grad)``, ``P.copy_(…)``, ``P.data = …``); the
model is ``M`` when ITERABLE is ``M.parameters()`` / ``M.named_parameters()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nndoctor.commands.fix.syntax import FixContext, dotted


@dataclass(frozen=True)
class HandUpdate:
    loop: Any  # the ``for P in …`` node
    param: str  # P
    model: str | None  # M of ``M.parameters()``, else None


def _param_name(ctx: FixContext, target: Any) -> list[str]:
    """The names a for-target binds (``p``; ``name, p``)."""
    cst = ctx.cst
    if isinstance(target, cst.Name):
        return [str(target.value)]
    if isinstance(target, cst.Tuple):
        return [str(e.value.value) for e in target.elements if isinstance(e.value, cst.Name)]
    return []


def reads_grad(ctx: FixContext, root: Any, name: str | None = None) -> bool:
    """``root`` reads ``X.grad`` (of ``name`` only, when given)."""
    return any(n.attr.value == "grad" and (name is None or dotted(n.value) == name)
               for n in ctx.nodes(ctx.cst.Attribute, root))


def _writes(ctx: FixContext, root: Any, name: str) -> bool:
    cst = ctx.cst
    own = {name, f"{name}.data"}
    for node in ctx.nodes(cst.AugAssign, root):
        if dotted(node.target) in own:
            return True
    for node in ctx.nodes(cst.Assign, root):
        if any(dotted(t.target) == f"{name}.data" for t in node.targets):
            return True
    for call in ctx.calls(root):
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value.endswith("_") and dotted(func.value) in own:
            return True
    return False


def hand_updates(ctx: FixContext, root: Any) -> list[HandUpdate]:
    """The hand-written parameter updates under ``root``, in source order."""
    cst = ctx.cst
    found = []
    for loop in ctx.nodes(cst.For, root):
        for name in _param_name(ctx, loop.target):
            if reads_grad(ctx, loop.body, name) and _writes(ctx, loop.body, name):
                iterable = loop.iter
                model = None
                if (isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Attribute)
                        and iterable.func.attr.value in ("parameters", "named_parameters")):
                    model = dotted(iterable.func.value)
                found.append(HandUpdate(loop, name, model))
                break
    return sorted(found, key=lambda u: ctx.start(u.loop))


def calls_method(ctx: FixContext, root: Any, method: str) -> list[Any]:
    return [c for c in ctx.calls(root) if isinstance(c.func, ctx.cst.Attribute) and c.func.attr.value == method]


def clears_grads(ctx: FixContext, root: Any) -> bool:
    """``root`` calls ``zero_grad()`` or sets some ``X.grad = None`` / ``X.grad.zero_()``."""
    cst = ctx.cst
    if calls_method(ctx, root, "zero_grad"):
        return True
    for node in ctx.nodes(cst.Assign, root):
        if any(isinstance(t.target, cst.Attribute) and t.target.attr.value == "grad" for t in node.targets):
            return True
    return any(isinstance(c.func.value, cst.Attribute) and c.func.value.attr.value == "grad"
               for c in calls_method(ctx, root, "zero_"))
