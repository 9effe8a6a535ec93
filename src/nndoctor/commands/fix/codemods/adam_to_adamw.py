"""O109: Adam(weight_decay=…) is L2 through the adaptive scaling — use AdamW (unsafe)."""

from __future__ import annotations

from nndoctor.commands.fix.syntax import FixContext, Uncertain, call_name, keyword

CODE = "O109"
SAFE = False
UNSAFE_REASON = ("AdamW decays the weights directly, so the same weight_decay value regularises "
                 "differently: the run changes beyond the bug and the value may need tuning")


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    statement = ctx.statement_at()
    adams = [c for c in ctx.calls(statement)
             if (call_name(c) or "").rsplit(".", 1)[-1] == "Adam" and keyword(c, "weight_decay") is not None]
    if len(adams) != 1:
        raise Uncertain("no single Adam(..., weight_decay=...) on this line")
    func = adams[0].func
    if not isinstance(func, cst.Attribute):
        raise Uncertain("Adam is imported by name: import AdamW and use it here")
    new = adams[0].with_changes(func=func.with_changes(attr=cst.Name("AdamW")))
    return ctx.replace(adams[0], new), "use AdamW (decoupled weight decay) instead of Adam with weight_decay"
