"""O101: no zero_grad — clear the gradients at the start of each step.

With an optimizer: ``optimizer.zero_grad()`` as the first statement of the loop. In a loop
updated by hand (no torch.optim): ``model.zero_grad()`` there when the update runs on every
pass over ``model.parameters()``; otherwise ``p.grad = None`` right after the update of each
``p`` (correct also when the update runs only every few passes, after accumulating).
"""

from __future__ import annotations

from typing import Any

from nndoctor.commands.fix.codemods._hand_update import clears_grads, hand_updates, reads_grad
from nndoctor.commands.fix.syntax import FixContext, Uncertain

CODE = "O101"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    statement = ctx.statement_at()
    loops = ctx.loops(statement)
    if not loops:
        raise Uncertain("backward() is not inside a loop in this file")
    loop = loops[0]
    optimizers = sorted(ctx.optimizer_names(loop))
    if not optimizers and (ctx.finding is None or (ctx.finding.evidence or {}).get("update") != "optimizer"):
        return _hand_written(ctx, statement, loop)
    if len(optimizers) != 1:
        raise Uncertain(f"{len(optimizers)} optimizers step in this loop: which one's gradients to clear?")
    return (ctx.insert_at_block_start(loop, [f"{optimizers[0]}.zero_grad()"]),
            f"call {optimizers[0]}.zero_grad() at the start of each step")


def _unconditional(ctx: FixContext, node: Any, loop: Any) -> bool:
    """``node`` runs on every pass of ``loop``: only blocks and ``with`` between them."""
    for ancestor in ctx.ancestors(node):
        if ancestor is loop:
            return True
        if not isinstance(ancestor, (ctx.cst.IndentedBlock, ctx.cst.With)):
            return False
    return False


def _hand_written(ctx: FixContext, backward: Any, loop: Any) -> tuple[str, str]:
    cst = ctx.cst
    updates = [u for u in hand_updates(ctx, loop) if ctx.loops(u.loop)[0] is loop]
    if not updates:
        raise Uncertain("no optimizer steps in this loop and no hand-written update "
                        "(`for p in model.parameters():` writing p from p.grad) is in it")
    if len(updates) > 1:
        raise Uncertain(f"{len(updates)} hand-written updates in this loop: which one's gradients to clear?")
    update = updates[0]
    if ctx.start(update.loop) <= ctx.end(backward):
        raise Uncertain("the hand-written update comes before backward() in the loop")
    if clears_grads(ctx, loop):
        raise Uncertain("the loop already clears some gradients (zero_grad() or .grad = None): "
                        "which ones are left to clear is not clear from the code")
    if update.model is not None and _unconditional(ctx, update.loop, loop):
        return (ctx.insert_at_block_start(loop, [f"{update.model}.zero_grad()"]),
                f"call {update.model}.zero_grad() at the start of each step (the hand-written update "
                "must see one step's gradients)")
    # After the update of each parameter. Refused when the loop body can skip its end, or the
    # gradients are read again after the update (they would be None there).
    body = update.loop.body
    if not isinstance(body, cst.IndentedBlock) or not body.body:
        raise Uncertain("the hand-written update is written on one line; there is no place for a new line")
    if ctx.nodes((cst.Continue, cst.Break), body):
        raise Uncertain("the hand-written update's loop has continue/break: `p.grad = None` at its end may be skipped")
    later = [s for s in ctx.walk(loop.body) if isinstance(s, cst.SimpleStatementLine)
             and ctx.start(s) > ctx.end(update.loop) and reads_grad(ctx, s)]
    if later:
        raise Uncertain(f"the gradients are read again after the update (line {ctx.start(later[0])})")
    return (ctx.insert(body.body[-1], [f"{update.param}.grad = None"], after=True),
            f"set {update.param}.grad = None after the hand-written update of each parameter")
