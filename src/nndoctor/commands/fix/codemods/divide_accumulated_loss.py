"""O108: gradient accumulation with the undivided loss — divide it by the number of micro-steps."""

from __future__ import annotations

from nndoctor.commands.fix.syntax import FixContext, Uncertain

CODE = "O108"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    statement = ctx.statement_at()
    backward = [c for c in ctx.calls(statement)
                if isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward" and not c.args]
    if len(backward) != 1 or not isinstance(backward[0].func.value, cst.Name):
        raise Uncertain("the line has no `loss.backward()` on a named loss")
    loops = ctx.loops(statement)
    if not loops:
        raise Uncertain("backward() is not inside a loop")
    # The accumulation count: the N of `if (i + 1) % N == 0:` around the optimizer step.
    counts = {ctx.code(op.right) for op in ctx.nodes(cst.BinaryOperation, loops[0])
              if isinstance(op.operator, cst.Modulo) and isinstance(op.right, (cst.Name, cst.Integer, cst.Attribute))}
    if len(counts) != 1:
        raise Uncertain(f"{'no' if not counts else 'more than one'} `% N` accumulation test in the loop")
    count = counts.pop()
    loss = backward[0].func.value
    divided = cst.parse_expression(f"({loss.value} / {count})")
    new = backward[0].with_changes(func=backward[0].func.with_changes(value=divided))
    return ctx.replace(backward[0], new), f"divide the loss by the {count} accumulated micro-steps"
