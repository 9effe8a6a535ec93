"""M102: training in eval mode after an evaluation — model.train() at the start of the loop."""

from __future__ import annotations

from nndoctor.commands.fix.syntax import FixContext, Uncertain, dotted

CODE = "M102"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    statement = ctx.statement_at()
    models = ctx.model_names()
    for loop in ctx.loops(statement):
        evals = {dotted(c.func.value) for c in ctx.calls(loop)
                 if isinstance(c.func, cst.Attribute) and c.func.attr.value == "eval" and not c.args}
        evals &= models
        if len(evals) == 1:
            model = evals.pop()
            return (ctx.insert_at_block_start(loop, [f"{model}.train()"]),
                    f"call {model}.train() at the start of each pass of the loop that evaluates")
        if len(evals) > 1:
            raise Uncertain("more than one model is put in eval mode in this loop")
    raise Uncertain("no model.eval() in the loops around this line (it may be in a function): "
                    "call model.train() at the start of the training loop")
