"""K101: a softmax/sigmoid output into a loss built with from_logits=True — set it to False."""

from __future__ import annotations

from nndoctor.commands.fix.syntax import FixContext, Uncertain, keyword

CODE = "K101"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    statement = ctx.statement_at()
    flags = [keyword(c, "from_logits") for c in ctx.calls(statement) if keyword(c, "from_logits") is not None]
    flags = [a for a in flags if isinstance(a.value, cst.Name) and a.value.value == "True"]
    if len(flags) != 1:
        raise Uncertain(f"{len(flags)} from_logits=True on this line; the loss may be built elsewhere")
    return (ctx.replace(flags[0].value, cst.Name("False")),
            "from_logits=False: the model's last layer already outputs probabilities")
