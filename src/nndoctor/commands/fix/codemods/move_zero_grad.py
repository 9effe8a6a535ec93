"""O102: zero_grad() between backward() and step() — move it before the loss is computed.

With an optimizer the finding is at ``step()``. In a loop updated by hand (no torch.optim) it
is at the next forward of the model; there the loop's own statements must read: one
``backward()``, then one ``zero_grad()``, then the update (a statement reading ``.grad``).
"""

from __future__ import annotations

from typing import Any

from nndoctor.commands.fix.codemods._hand_update import calls_method, reads_grad
from nndoctor.commands.fix.syntax import FixContext, Uncertain, dotted

CODE = "O102"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    statement = ctx.statement_at()
    if calls_method(ctx, statement, "step"):
        owner = ctx.parent(statement)
        body = list(getattr(owner, "body", ()))
        if owner is None or statement not in body:
            raise Uncertain("step() is not a statement of a block")
        return _move(ctx, owner, body, body.index(statement), "step()")
    loops = ctx.loops(statement)
    if not loops or not isinstance(loops[0].body, ctx.cst.IndentedBlock):
        raise Uncertain("no optimizer step() here and the line is not inside a loop")
    owner = loops[0].body
    body = list(owner.body)
    zero = [i for i, s in enumerate(body) if calls_method(ctx, s, "zero_grad")]
    update = [i for i, s in enumerate(body) if zero and i > zero[0] and reads_grad(ctx, s)]
    if not update:
        raise Uncertain("no step() here and the loop has no hand-written update (reading .grad) "
                        "after its zero_grad()")
    return _move(ctx, owner, body, update[0], "the hand-written update")


def _move(ctx: FixContext, owner: Any, body: list[Any], index: int, what: str) -> tuple[str, str]:
    """Move the one ``zero_grad()`` between ``backward()`` and ``body[index]`` before the loss."""
    zero = [s for s in body[:index] if calls_method(ctx, s, "zero_grad")]
    backward = [s for s in body[:index] if calls_method(ctx, s, "backward")]
    if len(zero) != 1 or len(backward) != 1 or body.index(zero[0]) < body.index(backward[0]):
        raise Uncertain(f"zero_grad() is not between one backward() and {what} in the same block")
    target = backward[0]
    # Before the statement that computes the loss backward() is called on, when it is right there.
    loss = dotted(calls_method(ctx, target, "backward")[0].func.value)
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
