"""R101: no seed — seed the framework's generators after the imports (unsafe)."""

from __future__ import annotations

from nndoctor.fix.syntax import FixContext, Uncertain

CODE = "R101"
SAFE = False
UNSAFE_REASON = "the run's random numbers change (once) from those of the unseeded run it replaces"


def propose(ctx: FixContext) -> tuple[str, str]:
    cst = ctx.cst
    imports = [s for s in ctx.module.body if isinstance(s, cst.SimpleStatementLine)
               and any(isinstance(small, (cst.Import, cst.ImportFrom)) for small in s.body)]
    aliases: dict[str, str] = {}
    for statement in imports:
        for small in statement.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    name = ctx.code(alias.name)
                    aliases[name] = ctx.code(alias.asname.name) if alias.asname else name
    if "torch" in aliases:
        call = f"{aliases['torch']}.manual_seed(0)"
    elif "keras" in aliases:
        call = f"{aliases['keras']}.utils.set_random_seed(0)"
    else:
        raise Uncertain("torch (or keras) is not imported at the top of this file with `import`")
    return (ctx.insert(imports[-1], [call], after=True),
            f"seed the generators after the imports: {call}")
