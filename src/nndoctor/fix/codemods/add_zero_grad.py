"""O101: no zero_grad — clear the gradients at the start of each step."""

from __future__ import annotations

from nndoctor.fix.syntax import FixContext, Uncertain

CODE = "O101"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    statement = ctx.statement_at()
    loops = ctx.loops(statement)
    if not loops:
        raise Uncertain("backward() is not inside a loop in this file")
    loop = loops[0]
    optimizers = sorted(ctx.optimizer_names(loop))
    if len(optimizers) != 1:
        raise Uncertain(f"{len(optimizers)} optimizers step in this loop: which one's gradients to clear?")
    return (ctx.insert_at_block_start(loop, [f"{optimizers[0]}.zero_grad()"]),
            f"call {optimizers[0]}.zero_grad() at the start of each step")
