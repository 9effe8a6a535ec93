"""R101: no seed — seed the framework's generators after the imports (unsafe)."""

from __future__ import annotations

from typing import Any

from nndoctor.commands.fix.syntax import FixContext, Uncertain

CODE = "R101"
SAFE = False
UNSAFE_REASON = "the run's random numbers change (once) from those of the unseeded run it replaces"

_FRAMEWORKS = ("torch", "keras", "tensorflow", "numpy", "torchvision", "transformers")


def _bound_names(ctx: FixContext, statement: Any) -> dict[str, str]:
    """Imported module -> the name it is bound to, for the framework imports of a statement."""
    cst = ctx.cst
    bound: dict[str, str] = {}
    for small in statement.body:
        if isinstance(small, cst.Import):
            for alias in small.names:
                name = ctx.code(alias.name)
                bound[name] = ctx.code(alias.asname.name) if alias.asname else name.split(".")[0]
        elif isinstance(small, cst.ImportFrom) and small.module is not None and not isinstance(small.names, cst.ImportStar):
            module = ctx.code(small.module)
            for alias in small.names:
                local = ctx.code(alias.asname.name) if alias.asname else ctx.code(alias.name)
                bound[f"{module}.{ctx.code(alias.name)}"] = local
    return bound


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    aliases: dict[str, str] = {}
    last_import = None
    framework_names: set[str] = set()
    # The seed goes after the leading imports, before the first statement that uses a framework.
    for statement in ctx.module.body:
        if isinstance(statement, cst.SimpleStatementLine) and any(
                isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body):
            bound = _bound_names(ctx, statement)
            aliases.update(bound)
            framework_names |= {local for module, local in bound.items() if module.split(".")[0] in _FRAMEWORKS}
            last_import = statement
            continue
        if isinstance(statement, cst.BaseCompoundStatement) or {n.value for n in ctx.nodes(cst.Name, statement)} & framework_names:
            break
    if last_import is None:
        raise Uncertain("no imports before the framework is first used")
    if "torch" in aliases:
        call = f"{aliases['torch']}.manual_seed(0)"
    elif "keras" in aliases:
        call = f"{aliases['keras']}.utils.set_random_seed(0)"
    else:
        raise Uncertain("torch (or keras) is not imported at the top of this file with `import`")
    return (ctx.insert(last_import, [call], after=True),
            f"seed the generators after the imports: {call}")
