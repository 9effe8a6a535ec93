"""M101: evaluation in training mode — model.eval() before the evaluation block, model.train() after."""

from __future__ import annotations

from nndoctor.commands.fix.syntax import FixContext, Uncertain, dotted

CODE = "M101"
SAFE = True

_NO_GRAD = ("no_grad", "inference_mode")


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    statement = ctx.statement_at()
    blocks = [w for w in ctx.enclosing(statement, cst.With)
              if any(((dotted(i.item.func) if isinstance(i.item, cst.Call) else dotted(i.item)) or "")
                     .endswith(_NO_GRAD) for i in w.items)]
    if not blocks:
        raise Uncertain("the evaluation is not inside a `with torch.no_grad()` block: "
                        "call model.eval() where the evaluation starts")
    block = blocks[-1]
    models = {dotted(c.func) for c in ctx.calls(block)} & ctx.model_names()
    if len(models) != 1:
        raise Uncertain(f"{len(models)} trained models are called in the evaluation block")
    model = models.pop()
    text = ctx.insert(block, [f"{model}.eval()"])
    # Insert model.train() after the block in the edited text (the block keeps its identity).
    after = FixContext(text, ctx.start(block) + 1)
    moved = after.statement_at()
    return (after.insert(moved, [f"{model}.train()"], after=True),
            f"call {model}.eval() before the evaluation and {model}.train() after it")
