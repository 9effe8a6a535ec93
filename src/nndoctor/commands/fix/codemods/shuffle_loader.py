"""D105: a training DataLoader without shuffle=True over class-sorted data."""

from __future__ import annotations

from typing import Any

from nndoctor.commands.fix.syntax import FixContext, Uncertain, call_name, keyword, with_keyword

CODE = "D105"
SAFE = True


def _loader_call(ctx: FixContext, statement: Any) -> Any:
    cst = ctx.cst
    here = [c for c in ctx.calls(statement) if (call_name(c) or "").endswith("DataLoader")]
    # Keras: model.fit(x, y, shuffle=False)
    here += [c for c in ctx.calls(statement) if isinstance(c.func, cst.Attribute) and c.func.attr.value == "fit"
             and keyword(c, "shuffle") is not None]
    if len(here) == 1:
        return here[0]
    if not isinstance(statement, cst.For):
        raise Uncertain("the line neither builds a DataLoader nor loops over one")
    source = statement.iter
    # for i, (x, y) in enumerate(loader) / tqdm(loader)
    while isinstance(source, cst.Call) and source.args and call_name(source) in ("enumerate", "tqdm", "tqdm.tqdm"):
        source = source.args[0].value
    if not isinstance(source, cst.Name):
        raise Uncertain(f"the loop iterates over {ctx.code(source)}, not a named DataLoader")
    built = ctx.assignment_before(source.value, ctx.start(statement)).value
    if not (call_name(built) or "").endswith("DataLoader"):
        raise Uncertain(f"'{source.value}' is not built by DataLoader(...) in this file")
    return built


def propose(ctx: FixContext) -> tuple[str, str]:
    call = _loader_call(ctx, ctx.statement_at())
    for conflicting in ("sampler", "batch_sampler"):
        if keyword(call, conflicting) is not None:
            raise Uncertain(f"the DataLoader has a {conflicting}: shuffle there (e.g. RandomSampler)")
    shuffle = keyword(call, "shuffle")
    if shuffle is None:
        if len([a for a in call.args if a.keyword is None]) > 2:
            raise Uncertain("shuffle may be given positionally")
        return ctx.replace(call, with_keyword(call, "shuffle", "True")), "shuffle the training DataLoader"
    if isinstance(shuffle.value, ctx.cst.Name) and shuffle.value.value == "False":
        new = call.with_changes(args=[a.with_changes(value=ctx.cst.Name("True")) if a is shuffle else a
                                      for a in call.args])
        what = "fit's batches" if isinstance(call.func, ctx.cst.Attribute) and call.func.attr.value == "fit" \
            else "the training DataLoader"
        return ctx.replace(call, new), f"shuffle {what}"
    raise Uncertain(f"shuffle={ctx.code(shuffle.value)} is computed: set it to True for training")
