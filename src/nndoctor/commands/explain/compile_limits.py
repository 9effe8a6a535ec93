"""P113 as a log shows it: torch.compile's dynamo hitting its recompile limit, either the
warning it logs and then runs the function uncompiled, or the error it raises instead
(``FailOnRecompileLimitHit``, with ``fullgraph=True`` or ``fail_on_recompile_limit_hit``).
The live check (``checks/compilation.py``) owns the code."""

from __future__ import annotations

import re
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation, variant
from nndoctor.commands.explain.crash import Crash
from nndoctor.core.findings import Finding, Location, Severity

# The limit's names over PyTorch releases: cache_size_limit (2.0–2.5), recompile_limit (2.6+),
# and their accumulated_ forms (torch/_dynamo/convert_frame.py, "torch._dynamo hit config.%s (%s)").
_LIMITS = r"(?:accumulated_)?(?:recompile_limit|cache_size_limit)"


@variant
class RecompileLimitHit(CrashExplanation):
    """
    ## What it does
    From a log: reports dynamo's warning "torch._dynamo hit config.recompile_limit (8)"
    (``cache_size_limit`` before PyTorch 2.6), after which the function runs uncompiled, and
    the error ``torch._dynamo.exc.FailOnRecompileLimitHit`` raised instead under
    ``fullgraph=True``, naming the function and the last guard that failed.

    ## References
    - PyTorch docs, Dealing with Recompilations: https://docs.pytorch.org/docs/stable/compile/programming_model.recompilation.html
    - PyTorch source, the warning and the error (torch/_dynamo/convert_frame.py): https://github.com/pytorch/pytorch/blob/main/torch/_dynamo/convert_frame.py
    """

    code = "P113"
    name = "compile-recompilation"
    severity = Severity.WARNING
    summary = "torch.compile recompiling repeatedly, hitting the limit, or graph breaks in the step"
    fix = "pass dynamic=True (or mark_dynamic), pass changing Python numbers as tensors, or pad to fixed sizes"
    patterns = (
        # "torchdynamo hit config.…" before the package moved into torch (2022).
        rf"(?:torch\._dynamo|torchdynamo) hit config\.(?P<limit>{_LIMITS}) \((?P<value>\d+)\)"
        # The next lines, after their "[0/8]" frame id: "function: 'fn' (train.py:3)", "last reason: …".
        r"(?:\s*(?:\[[\d/]+\])?\s*function: '?(?P<function>[^'\s(]+)'?(?: \((?P<where>[^)]+)\))?)?"
        r"(?:\s*(?:\[[\d/]+\])?\s*(?:last reason|reasons): +(?P<reason>[^\n]+))?",
        # torchdynamo before it moved into PyTorch (2022): "torchdynamo hit recompilation cache
        # limit (64) for function 'forward' (…/model.py:381), due to the following guard failures: …"
        r"torchdynamo hit recompilation (?P<limit>cache) limit \((?P<value>\d+)\) for function '(?P<function>\w+)'"
        r"(?: \((?P<where>[^)]+)\))?",
        rf"(?P<limit>{_LIMITS}) reached",
        r"(?P<error>FailOnRecompileLimitHit)",
    )
    warning_lines = (rf"torch\._dynamo hit config\.{_LIMITS} \(\d+\)",
                     rf"torchdynamo hit config\.{_LIMITS} \(\d+\)",
                     r"torchdynamo hit recompilation cache limit \(\d+\) for function")
    log_context_lines = 2
    order = 30

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        # The warning before an unrelated exception does not explain it; the exception itself
        # must be the limit's (FailOnRecompileLimitHit), and then the warning above adds its facts.
        own = f"{crash.exc_type}: {crash.message}"
        if not any(re.search(pattern, own, re.S) for pattern in cls.patterns):
            return None
        return super().match(crash)

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        limit = facts.get("limit", "recompile_limit")
        value = facts.get("value")
        evidence: dict[str, Any] = {"limit": limit}
        if value:
            evidence["limit_value"] = int(value)
        for key in ("function", "where", "reason"):
            if facts.get(key):
                # dynamo pads the reason and appends the guarded source line after "#".
                evidence[key] = re.split(r"\s{2,}#", facts[key])[0].strip()
        function = f"the function {evidence['function']}" if "function" in evidence else "a function"
        if "where" in evidence:
            function += f" ({evidence['where']})"
        times = f" {value} times" if value else ""
        consequence = ("so it failed instead of running uncompiled" if facts.get("error") or crash.short_type.startswith("FailOn")
                       else "so from then on it runs uncompiled (eager), after paying the compile time of every recompilation")
        setting = "its recompilation cache limit" if limit == "cache" else f"config.{limit}"
        message = (f"torch.compile recompiled {function}{times} and hit {setting}: a guard failed on each "
                   f"call (a changing Python number, shape or dtype), {consequence}.")
        if "reason" in evidence:
            message += f" Last reason: {evidence['reason']}."
        finding = cls.make(crash, message, evidence=evidence)
        place = re.fullmatch(r"(?P<path>.+?):(?P<line>\d+)", evidence.get("where", ""))
        if finding.location is None and place:
            # dynamo names the compiled function's file and first line: the user's code, in a log.
            finding.location = Location(place["path"], int(place["line"]))
        return finding
