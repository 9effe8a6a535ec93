"""D101: 0..255 pixels given to the model — divide by 255 where they become floats."""

from __future__ import annotations

from typing import Any

from nndoctor.commands.fix.syntax import FixContext, Uncertain, dotted

CODE = "D101"
SAFE = True


def _becomes_float(ctx: FixContext, node: Any) -> bool:
    """``….float()`` or ``….to(torch.float32)``: where integer pixels turn into floats."""
    cst = ctx.cst
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
        return False
    method = node.func.attr.value
    if method == "float" and not node.args:
        return True
    return method in ("to", "type", "astype") and any("float" in ctx.code(a.value) for a in node.args)


def _divided(ctx: FixContext, node: Any) -> Any:
    return ctx.cst.parse_expression(f"{ctx.code(node)} / 255")


def propose(ctx: FixContext) -> tuple[str, str]:
    statement = ctx.statement_at()
    models = ctx.model_names()
    calls = [c for c in ctx.calls(statement) if dotted(c.func) in models and c.args]
    if not calls:  # Keras: model.fit(x, y, ...)
        calls = [c for c in ctx.calls(statement) if isinstance(c.func, ctx.cst.Attribute)
                 and c.func.attr.value in ("fit", "train_on_batch") and c.args]
        models = {name for c in calls if (name := dotted(c.func.value))}
    if len(calls) != 1:
        raise Uncertain(f"{'no' if not calls else 'more than one'} call of the trained model on this line")
    arg = calls[0].args[0]
    scope = ctx.scope_of(statement)
    if arg.star == "**" and isinstance(arg.value, ctx.cst.Name):  # model(**batch)
        built = ctx.assignment_before(arg.value.value, ctx.start(statement), scope).value
        if not isinstance(built, ctx.cst.Dict):
            raise Uncertain(f"'{arg.value.value}' is not a dict literal in this file")
        floats = [e for e in built.elements if isinstance(e, ctx.cst.DictElement) and _becomes_float(ctx, e.value)]
        if len(floats) != 1:
            raise Uncertain(f"{len(floats)} values of '{arg.value.value}' become floats: which are the pixels?")
        return (ctx.replace(floats[0].value, _divided(ctx, floats[0].value)),
                "scale the pixels to 0..1 where they become floats")
    if arg.star or arg.keyword is not None:
        raise Uncertain("the model's input is not its first positional argument")
    value = arg.value
    if isinstance(value, ctx.cst.Name):
        assigned = [a for a in ctx.assignments(value.value, scope) if ctx.start(a) <= ctx.start(statement)]
        if assigned and _becomes_float(ctx, assigned[-1].value):
            return (ctx.replace(assigned[-1].value, _divided(ctx, assigned[-1].value)),
                    f"scale the pixels to 0..1 where '{value.value}' becomes float")
        if not assigned:
            # A loop variable from a loader: the Dataset's __getitem__ makes the floats.
            getitem = [f for f in ctx.nodes(ctx.cst.FunctionDef) if f.name.value == "__getitem__"]
            made = [a for f in getitem for a in ctx.nodes(ctx.cst.Assign, f) if _becomes_float(ctx, a.value)]
            if len(made) == 1:
                return (ctx.replace(made[0].value, _divided(ctx, made[0].value)),
                        "scale the pixels to 0..1 in the Dataset's __getitem__, where they become floats")
            if len(made) > 1:
                raise Uncertain("more than one value becomes float in __getitem__: which are the pixels?")
    other_calls = [c for c in ctx.calls() if c is not calls[0] and (
        dotted(c.func) in models or (isinstance(c.func, ctx.cst.Attribute) and dotted(c.func.value) in models
                                     and c.func.attr.value in ("fit", "predict", "evaluate")))]
    if other_calls:
        raise Uncertain(f"the model is also called at line {ctx.start(other_calls[0])}: scaling this input "
                        "alone would give it two input ranges; scale where the data is loaded")
    return ctx.replace(value, _divided(ctx, value)), "scale the model's input to 0..1"
