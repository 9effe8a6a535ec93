"""C103: torch.save(model) pickles the class — save model.state_dict()."""

from __future__ import annotations

from nndoctor.commands.fix.syntax import FixContext, Uncertain, call_name

CODE = "C103"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    statement = ctx.statement_at()
    saves = [c for c in ctx.calls(statement) if (call_name(c) or "").endswith("save") and c.args]
    if len(saves) != 1 or not isinstance(saves[0].args[0].value, (cst.Name, cst.Attribute)):
        raise Uncertain("no torch.save(model, …) of a named model on this line")
    loads = [c for c in ctx.calls() if (call_name(c) or "").endswith("torch.load")]
    if loads:
        raise Uncertain(f"torch.load at line {ctx.start(loads[0])} may expect the whole model: "
                        "change it to rebuild the model and load_state_dict together with this save")
    model = saves[0].args[0].value
    new_value = cst.parse_expression(f"{ctx.code(model)}.state_dict()")
    return ctx.replace(model, new_value), f"save {ctx.code(model)}.state_dict(), not the pickled model"
