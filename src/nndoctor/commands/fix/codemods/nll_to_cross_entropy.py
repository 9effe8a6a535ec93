"""L103: NLLLoss given raw logits — use cross-entropy, which applies log_softmax itself."""

from __future__ import annotations

from nndoctor.commands.fix.codemods._losses import loss_call
from nndoctor.commands.fix.syntax import FixContext, Uncertain, call_name

CODE = "L103"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    statement = ctx.statement_at()
    loss = loss_call(ctx, statement, functions={"nll_loss"}, classes={"NLLLoss"})
    cst = ctx.cst
    if isinstance(loss.func, cst.Attribute) and loss.func.attr.value == "nll_loss":
        new = loss.with_changes(func=loss.func.with_changes(attr=cst.Name("cross_entropy")))
        return ctx.replace(loss, new), "call cross_entropy (log_softmax + nll_loss) on the logits"
    if isinstance(loss.func, cst.Name) and loss.func.value != "nll_loss":
        built = ctx.assignment_before(loss.func.value, ctx.start(loss)).value
        if isinstance(built.func, cst.Attribute) and built.func.attr.value == "NLLLoss":
            new = built.with_changes(func=built.func.with_changes(attr=cst.Name("CrossEntropyLoss")))
            return ctx.replace(built, new), "use CrossEntropyLoss (log_softmax + NLLLoss) on the logits"
    raise Uncertain(f"{call_name(loss)} is imported by name: change it to cross_entropy with its import")
