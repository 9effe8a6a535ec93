"""Finding the loss call on a line, and dropping the activation that feeds it (L101, L102)."""

from __future__ import annotations

from typing import Any

from nndoctor.commands.fix.syntax import (
    FixContext,
    Uncertain,
    call_name,
    dotted,
    without_last_element,
)


def loss_call(ctx: FixContext, statement: Any, functions: set[str], classes: set[str]) -> Any:
    """The call on ``statement`` to a loss: ``F.<function>(…)`` or ``criterion(…)`` where
    ``criterion = nn.<Class>(…)`` (the last such assignment before the line)."""
    found = [call for call in ctx.calls(statement) if is_loss(ctx, call, functions, classes)]
    if len(found) != 1:
        raise Uncertain(f"{'no' if not found else 'more than one'} loss call on line {ctx.start(statement)}")
    return found[0]


def is_loss(ctx: FixContext, call: Any, functions: set[str], classes: set[str]) -> bool:
    """``call`` is ``F.<function>(…)``, ``nn.<Class>(…)(…)`` or ``criterion(…)`` with
    ``criterion = nn.<Class>(…)`` (the last such assignment before it)."""
    if (call_name(call) or "").rsplit(".", 1)[-1] in functions:
        return True
    if (call_name(call.func) or "").rsplit(".", 1)[-1] in classes:  # nn.CrossEntropyLoss()(out, y)
        return True
    if isinstance(call.func, ctx.cst.Name):
        try:
            built = ctx.assignment_before(call.func.value, ctx.start(call))
        except Uncertain:
            return False
        return (call_name(built.value) or "").rsplit(".", 1)[-1] in classes
    return False


def activation_input(ctx: FixContext, node: Any, activations: set[str]) -> Any | None:
    """For ``F.softmax(x, …)``, ``torch.softmax(x, …)`` or ``x.softmax(…)``: the node ``x``."""
    cst = ctx.cst
    if not isinstance(node, cst.Call):
        return None
    first = node.args[0].value if node.args and node.args[0].keyword is None else None
    if isinstance(node.func, cst.Name):
        return first if node.func.value in activations else None
    if not (isinstance(node.func, cst.Attribute) and node.func.attr.value in activations):
        return None
    if dotted(node.func.value) in _FUNCTION_MODULES:
        return first
    return node.func.value  # a tensor method: model(x).softmax(dim=1)


_MOVES = {"to", "float", "double", "half", "bfloat16", "cuda", "cpu", "train"}
_FUNCTION_MODULES = {"F", "torch", "nn.functional", "torch.nn.functional", "functional", "torch.special"}


_RANKINGS = ("argmax", "argsort", "topk")


def _harmless_use(ctx: FixContext, node: Any, functions: set[str], classes: set[str]) -> bool:
    """``node`` (a model output) goes through argmax (unchanged by the activation) or is the
    first argument of another loss of this kind (which wants the logits too)."""
    cst = ctx.cst
    parent = ctx.parent(node)
    if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in _RANKINGS:
        return True
    if isinstance(parent, cst.Arg) and parent.keyword is None:
        call = ctx.parent(parent)
        return (isinstance(call, cst.Call) and bool(call.args) and call.args[0] is parent
                and is_loss(ctx, call, functions, classes))
    return False


def _only_monotone_uses(ctx: FixContext, model: str, functions: set[str], classes: set[str]) -> None:
    """Every output of the model, anywhere in the file, goes only through argmax or into a loss
    of this kind, directly or through a name (``output = model(x)``) used only so."""
    cst = ctx.cst
    for call in ctx.calls():
        if dotted(call.func) != model or _harmless_use(ctx, call, functions, classes):
            continue
        parent = ctx.parent(call)
        holder = None
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name):
            holder = parent.targets[0].target
        uses = [u for u in ctx.uses(holder.value, ctx.scope_of(call)) if u is not holder] if holder is not None else []
        bad = [u for u in uses if not _harmless_use(ctx, u, functions, classes)]
        if holder is None or bad:
            line = ctx.start(bad[0]) if bad else ctx.start(call)
            raise Uncertain(f"the model's outputs are also used at line {line}, where they may be "
                            "meant as probabilities: drop the activation there by hand and apply it where "
                            "probabilities are needed")


def drop_activation(ctx: FixContext, functions: set[str], classes: set[str], activations: set[str],
                    modules: set[str]) -> tuple[str, str]:
    """Feed the loss what the activation received: at the call, the assignment, or the model."""
    statement = ctx.statement_at()
    loss = loss_call(ctx, statement, functions, classes)
    if not loss.args:
        raise Uncertain("the loss call has no arguments")
    first = loss.args[0].value
    inner = activation_input(ctx, first, activations)
    if inner is not None:  # criterion(F.softmax(logits, 1), y)
        return ctx.replace(first, inner), f"pass the logits to the loss, not {ctx.code(first)}"
    if isinstance(first, ctx.cst.Name):  # probs = logits.softmax(1); criterion(probs, y)
        assign = ctx.assignment_before(first.value, ctx.start(statement), ctx.scope_of(statement))
        inner = activation_input(ctx, assign.value, activations)
        model = dotted(assign.value.func) if isinstance(assign.value, ctx.cst.Call) else None
        if inner is None and model is not None:
            # output = model(x); criterion(output, y): the model ends in the activation.
            _model_assignment(ctx, model, statement)
            _only_monotone_uses(ctx, model, functions, classes)
            return _drop_from_model(ctx, model, statement, activations, modules)
        if inner is None:
            raise Uncertain(f"'{first.value}' is not computed by a {'/'.join(sorted(activations))} in this file")
        scope = ctx.scope_of(statement)
        others = [u for u in ctx.uses(first.value, scope) if u is not first and u is not assign.targets[0].target]
        if others:
            raise Uncertain(f"'{first.value}' is also used at line {ctx.start(others[0])}: "
                            "give the loss the logits and keep the probabilities for that use")
        return (ctx.replace(assign, assign.with_changes(value=inner)),
                f"drop the activation where '{first.value}' is computed: the loss applies it itself")
    if isinstance(first, ctx.cst.Call):  # criterion(model(x), y), the model ends in the activation
        model = dotted(first.func)
        if model is None:
            raise Uncertain("the loss input is not a call of a named model")
        _only_monotone_uses(ctx, model, functions, classes)
        return _drop_from_model(ctx, model, statement, activations, modules)
    raise Uncertain("the loss input is not a name, a call or an activation")


def _drop_from_model(ctx: FixContext, model: str, statement: Any, activations: set[str],
                     modules: set[str]) -> tuple[str, str]:
    assign = _model_assignment(ctx, model, statement)
    built = assign.value
    # Model(...).to(device) / .float() / .cuda(): the model is what the chain starts from.
    while (isinstance(built, ctx.cst.Call) and isinstance(built.func, ctx.cst.Attribute)
           and built.func.attr.value in _MOVES and isinstance(built.func.value, ctx.cst.Call)):
        built = built.func.value
    name = call_name(built) or ""
    if name.endswith("Sequential") and built.args:
        last = built.args[-1].value
        if (call_name(last) or "").rsplit(".", 1)[-1] in modules:
            return (ctx.replace(built, without_last_element(built)),
                    f"remove the final {ctx.code(last)} from the model: the loss applies it itself")
        raise Uncertain("the model's Sequential does not end in the activation")
    # A class defined in this file whose forward returns activation(x): return x.
    cls = [c for c in ctx.nodes(ctx.cst.ClassDef) if c.name.value == name]
    if len(cls) != 1:
        raise Uncertain(f"the model {name or model!r} is not defined in this file")
    forwards = [f for f in ctx.nodes(ctx.cst.FunctionDef, cls[0]) if f.name.value == "forward"]
    returns = [r for f in forwards for r in ctx.nodes(ctx.cst.Return, f) if r.value is not None]
    if len(returns) != 1:
        raise Uncertain(f"{name}.forward has {len(returns)} return statements")
    inner = activation_input(ctx, returns[0].value, activations)
    if inner is None and isinstance(returns[0].value, ctx.cst.Name):
        # output = F.softmax(x, dim=1); return output
        return _drop_returned_name(ctx, name, returns[0], activations)
    if inner is None:
        # return self.classifier(x), where self.classifier = nn.Sequential(..., nn.Softmax(dim=1))
        submodule = _self_sequential(ctx, cls[0], returns[0].value)
        if submodule is not None and (call_name(submodule.args[-1].value) or "").rsplit(".", 1)[-1] in modules:
            return (ctx.replace(submodule, without_last_element(submodule)),
                    f"remove the final {ctx.code(submodule.args[-1].value)} from {name}: the loss applies it itself")
        raise Uncertain(f"{name}.forward does not return an activation's output")
    return (ctx.replace(returns[0].value, inner),
            f"return the logits from {name}.forward: the loss applies the activation itself")


def _self_sequential(ctx: FixContext, cls: Any, returned: Any) -> Any | None:
    """For ``return self.head(x)``: the ``nn.Sequential(...)`` call assigned to ``self.head``."""
    if not (isinstance(returned, ctx.cst.Call) and isinstance(returned.func, ctx.cst.Attribute)
            and dotted(returned.func.value) == "self"):
        return None
    target = f"self.{returned.func.attr.value}"
    built = [a.value for a in ctx.nodes(ctx.cst.Assign, cls)
             if len(a.targets) == 1 and dotted(a.targets[0].target) == target]
    if len(built) != 1 or not (call_name(built[0]) or "").endswith("Sequential") or not built[0].args:
        return None
    return built[0]


def _model_assignment(ctx: FixContext, model: str, statement: Any) -> Any:
    """Where ``model`` is built: the last assignment before ``statement`` in its function, else
    in the file; for a parameter of the function (``def train(model, …)``), the one assignment
    of that name in the file (none or several: Uncertain)."""
    try:
        return ctx.assignment_before(model, ctx.start(statement), ctx.scope_of(statement))
    except Uncertain:
        pass
    try:
        return ctx.assignment_before(model, ctx.start(statement))
    except Uncertain:
        scope = ctx.scope_of(statement)
        params = [p.name.value for p in scope.params.params] if isinstance(scope, ctx.cst.FunctionDef) else []
        everywhere = ctx.assignments(model)
        if model in params and len(everywhere) == 1:
            return everywhere[0]
        raise Uncertain(f"the model '{model}' is not built in this file (or is built in several places)") from None


def _drop_returned_name(ctx: FixContext, model: str, returned: Any, activations: set[str]) -> tuple[str, str]:
    """``out = F.softmax(x, dim=1)`` then ``return out``: assign ``x`` instead (remove the line
    when it would read ``x = x``)."""
    cst = ctx.cst
    name = returned.value.value
    forward = ctx.enclosing(returned, cst.FunctionDef)[0]
    assigns = [a for a in ctx.assignments(name, forward) if ctx.start(a) < ctx.start(returned)]
    inner = activation_input(ctx, assigns[-1].value, activations) if assigns else None
    if inner is None:
        raise Uncertain(f"{model}.forward does not return an activation's output")
    last = assigns[-1]
    later = [u for u in ctx.uses(name, forward) if ctx.start(u) > ctx.end(last) and u is not returned.value]
    if later:
        raise Uncertain(f"'{name}' is also used at line {ctx.start(later[0])} in {model}.forward")
    title = f"return the logits from {model}.forward: the loss applies the activation itself"
    line = ctx.statement_of(last)
    if isinstance(inner, cst.Name) and inner.value == name:
        if len(line.body) != 1:
            raise Uncertain("the activation shares its line with another statement")
        return str(ctx.module.deep_remove(line).code), title
    return ctx.replace(last, last.with_changes(value=inner)), title
