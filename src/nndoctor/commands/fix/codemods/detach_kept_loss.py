"""P108: loss tensors kept with their graphs (a list, a running sum) — keep them detached."""

from __future__ import annotations

from typing import Any

from nndoctor.commands.fix.syntax import FixContext, Uncertain, dotted

CODE = "P108"
SAFE = True


def _kept(ctx: FixContext, root: Any, name: str) -> list[Any]:
    """Name nodes where ``name`` is kept: ``X.append(name)``, ``X += name``, ``X = X + name``."""
    cst = ctx.cst
    kept = []
    for call in ctx.calls(root):
        if (isinstance(call.func, cst.Attribute) and call.func.attr.value in ("append", "extend")
                and call.args and isinstance(call.args[0].value, cst.Name) and call.args[0].value.value == name):
            kept.append(call.args[0].value)
    for aug in ctx.nodes(cst.AugAssign, root):
        if isinstance(aug.operator, cst.AddAssign) and isinstance(aug.value, cst.Name) and aug.value.value == name:
            kept.append(aug.value)
    for assign in ctx.nodes(cst.Assign, root):
        value = assign.value
        if (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add)
                and isinstance(value.right, cst.Name) and value.right.value == name
                and any(dotted(t.target) == dotted(value.left) for t in assign.targets)):
            kept.append(value.right)
    return kept


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    statement = ctx.statement_at()
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and statement.body else None
    if isinstance(small, cst.AugAssign) and isinstance(small.value, cst.Name):
        kept = [small.value]
    elif isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        loops = ctx.loops(statement)
        kept = _kept(ctx, loops[0] if loops else ctx.scope_of(statement), small.targets[0].target.value)
    else:  # the line that keeps it: losses.append(loss)
        seen = {n.value for n in ctx.nodes(cst.Name, statement)}
        kept = [n for name in sorted(seen) for n in _kept(ctx, statement, name)]
    if not kept:
        raise Uncertain("the loss is kept somewhere this file does not show (a call into another function?)")
    new_module = ctx.module
    for node in kept:
        new_module = new_module.deep_replace(node, cst.parse_expression(f"{node.value}.detach()"))
    names = sorted({n.value for n in kept})
    return new_module.code, f"keep {', '.join(names)}.detach() (the value, without its graph)"
