"""C104: torch.load(weights_only=False) can run code from the file — load with weights_only=True."""

from __future__ import annotations

from nndoctor.commands.fix.syntax import FixContext, Uncertain, call_name, keyword

CODE = "C104"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    statement = ctx.statement_at()
    loads = [c for c in ctx.calls(statement) if (call_name(c) or "").endswith("load")
             and keyword(c, "weights_only") is not None]
    if len(loads) != 1:
        raise Uncertain("no single load(..., weights_only=...) on this line")
    arg = keyword(loads[0], "weights_only")
    if not (isinstance(arg.value, cst.Name) and arg.value.value == "False"):
        raise Uncertain(f"weights_only={ctx.code(arg.value)} is computed here")
    return ctx.replace(arg.value, cst.Name("True")), "load with weights_only=True"
