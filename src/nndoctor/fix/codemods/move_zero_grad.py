"""O102: zero_grad() between backward() and step() — move it before the loss is computed."""

from __future__ import annotations

from typing import Any

from nndoctor.fix.syntax import FixContext, Uncertain, dotted

CODE = "O102"
SAFE = True


def _calls_method(ctx: FixContext, statement: Any, method: str) -> list[Any]:
    return [c for c in ctx.calls(statement)
            if isinstance(c.func, ctx.cst.Attribute) and c.func.attr.value == method]


def propose(ctx: FixContext) -> tuple[str, str]:
    step = ctx.statement_at()
    owner = ctx.parent(step)
    body = list(getattr(owner, "body", ()))
    if owner is None or step not in body:
        raise Uncertain("step() is not a statement of a block")
    index = body.index(step)
    zero = [s for s in body[:index] if _calls_method(ctx, s, "zero_grad")]
    backward = [s for s in body[:index] if _calls_method(ctx, s, "backward")]
    if len(zero) != 1 or len(backward) != 1 or body.index(zero[0]) < body.index(backward[0]):
        raise Uncertain("zero_grad() is not between one backward() and this step() in the same block")
    target = backward[0]
    # Before the statement that computes the loss backward() is called on, when it is right there.
    loss = dotted(_calls_method(ctx, target, "backward")[0].func.value)
    computes = [s for s in body[:body.index(target)]
                if isinstance(s, ctx.cst.SimpleStatementLine) and any(
                    isinstance(small, ctx.cst.Assign) and any(dotted(t.target) == loss for t in small.targets)
                    for small in s.body)]
    if computes:
        target = computes[-1]
    moved = zero[0]
    rest = [s for s in body if s is not moved]
    at = rest.index(target)
    new_body = [*rest[:at], moved.with_changes(leading_lines=()), *rest[at:]]
    new_owner = owner.with_changes(body=new_body)
    return ctx.replace(owner, new_owner), "clear the gradients before the backward pass, not after it"
