"""C101: a wrapper's state_dict saved (``module.``/``_orig_mod.`` keys) — save the inner model's."""

from __future__ import annotations

from nndoctor.commands.fix.syntax import FixContext, Uncertain, call_name, dotted

CODE = "C101"
SAFE = True

_INNER = {"module.": "module", "_orig_mod.": "_orig_mod"}


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    prefix = str((ctx.finding.evidence if ctx.finding else {}).get("prefix", ""))
    statement = ctx.statement_at()
    state_dicts = [c for c in ctx.calls(statement)
                   if isinstance(c.func, cst.Attribute) and c.func.attr.value == "state_dict" and not c.args]
    if len(state_dicts) != 1:
        raise Uncertain(f"{len(state_dicts)} state_dict() calls on this line")
    owner = state_dicts[0].func.value
    inner = _INNER.get(prefix)
    if inner is None and dotted(owner) is not None:
        try:
            built = call_name(ctx.assignment_before(str(dotted(owner)), ctx.start(statement)).value) or ""
        except Uncertain:
            built = ""
        inner = "_orig_mod" if built.endswith("compile") else "module" if built.endswith(
            ("DataParallel", "DistributedDataParallel")) else None
    if inner is None:
        raise Uncertain("the wrapper is neither DataParallel/DDP nor torch.compile")
    if isinstance(owner, cst.Attribute) and owner.attr.value == inner:
        raise Uncertain(f"already saving {ctx.code(owner)}.state_dict(): the prefix comes from a wrapper inside")
    new_owner = cst.Attribute(value=owner, attr=cst.Name(inner))
    new = state_dicts[0].with_changes(func=state_dicts[0].func.with_changes(value=new_owner))
    return ctx.replace(state_dicts[0], new), f"save the unwrapped model: {ctx.code(owner)}.{inner}.state_dict()"
