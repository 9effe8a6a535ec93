"""B101: a Keras-style BatchNorm momentum (0.99) in PyTorch — use 1 - momentum."""

from __future__ import annotations

from nndoctor.commands.fix.syntax import FixContext, Uncertain, call_name, keyword

CODE = "B101"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    statement = ctx.statement_at()
    found = [c for c in ctx.calls(statement)
             if "BatchNorm" in (call_name(c) or "") and keyword(c, "momentum") is not None]
    if not found:
        raise Uncertain("no BatchNorm(..., momentum=...) on this line")
    text = ctx.source
    changed = []
    for call in found:
        arg = keyword(call, "momentum")
        if not isinstance(arg.value, cst.Float):
            raise Uncertain(f"momentum={ctx.code(arg.value)} is not a number written here")
        value = float(arg.value.value)
        if value <= 0.5:
            continue
        changed.append((arg.value, f"{round(1.0 - value, 10):g}"))
    if not changed:
        raise Uncertain("no momentum above 0.5 on this line")
    new_module = ctx.module
    for old, new in changed:
        new_module = new_module.deep_replace(old, cst.Float(new))
    text = new_module.code
    first = changed[0]
    return (text, f"momentum={ctx.code(first[0])} → {first[1]}: PyTorch's momentum is the weight of the "
                  "new batch, 1 − the Keras/TensorFlow decay")
