"""torch.compile behaviour: P113 recompilation, the recompile limit, graph breaks."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any

from nndoctor.checks.compile_records import (
    GraphBreak,
    Recompilation,
    graph_break_count,
    graph_breaks_since,
    guard_failure_counts,
    recompilations_since,
)
from nndoctor.core.events import RunEnd, StepEnd
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import sampled_only
from nndoctor.core.user_code import display_path
from nndoctor.instrument.training_probe import compile_log


@dataclass
class CompileCounters:
    """The parts of ``torch._dynamo.utils.counters`` P113 reads (plain numbers and strings)."""

    unique_graphs: int = 0
    graph_breaks: dict[str, int] = field(default_factory=dict)
    limit_hits: int = 0

    @classmethod
    def read(cls) -> CompileCounters | None:
        """The counters now, or None when torch.compile was never used (nothing imported)."""
        utils = sys.modules.get("torch._dynamo.utils")
        counters = getattr(utils, "counters", None)
        if counters is None:
            return None
        return cls.from_mapping(counters)

    @classmethod
    def from_mapping(cls, counters: Any) -> CompileCounters:
        unimplemented = counters.get("unimplemented", {})
        return cls(
            unique_graphs=int(counters.get("stats", {}).get("unique_graphs", 0)),
            graph_breaks={str(k): int(v) for k, v in counters.get("graph_break", {}).items()},
            limit_hits=sum(int(v) for k, v in unimplemented.items()
                           if "recompile limit" in str(k).lower() or "cache_size_limit" in str(k)),
        )

    def since(self, before: CompileCounters) -> CompileCounters:
        return CompileCounters(
            unique_graphs=self.unique_graphs - before.unique_graphs,
            graph_breaks={k: v - before.graph_breaks.get(k, 0) for k, v in self.graph_breaks.items()
                          if v > before.graph_breaks.get(k, 0)},
            limit_hits=self.limit_hits - before.limit_hits,
        )


def first_line(reason: str) -> str:
    return reason.strip().splitlines()[0].strip() if reason.strip() else reason


_WHERE = re.compile(r"function: '([^']+)' \((.+):(\d+)\)")
_LAST_REASON = re.compile(r"last reason: (?:\S+: )?(.+)")


def parse_limit_warning(message: str) -> tuple[str | None, Location | None, str | None]:
    """(function, its file:line, the last guard that failed) from dynamo's recompile-limit
    warning."""
    where = _WHERE.search(message)
    reason = _LAST_REASON.search(message)
    function = where.group(1) if where else None
    location = Location(display_path(where.group(2)), int(where.group(3))) if where else None
    return function, location, reason.group(1).strip() if reason else None


def compile_verdict(delta: CompileCounters, steps: int, *, recompiles: int = 0, user_breaks: int = 0,
                    min_graphs: int = 8, min_recompiles: int = 4) -> str | None:
    """Which problem the run shows (None: healthy). ``recompiles``: recompilations dynamo
    recorded guard failures for; ``user_breaks``: graph breaks at a line of the user's code.
    Dynamo counts graph breaks when it compiles, not when the compiled code runs: a break
    recorded once costs on every later call."""
    if delta.limit_hits > 0:
        return "limit"
    if steps >= 4 and (recompiles >= min_recompiles and recompiles * 4 >= steps
                       or delta.unique_graphs >= min_graphs and delta.unique_graphs >= steps / 2):
        return "recompiling"
    if steps >= 4 and user_breaks > 0:
        return "graph_breaks"
    return None


_VALUE_GUARD = re.compile(r"==\s*-?[\d.e+-]+\s*$|==\s*(True|False|None)\s*$")


def recompile_suggestion(reason: str | None) -> str:
    """The fix matching the guard that failed."""
    text = (reason or "").lower()
    if "size mismatch" in text or "stride mismatch" in text or "shape" in text or ".size()" in text:
        return ("the input shapes change between calls: pass dynamic=True, mark the varying dimension with "
                "torch._dynamo.mark_dynamic(x, dim), or pad/bucket inputs to a few fixed sizes")
    if _VALUE_GUARD.search(reason or "") or "==" in text:
        return ("a Python number the compiled code reads changes between calls (a learning rate, a step "
                "count): pass it as a tensor (torch.tensor(value), e.g. lr=torch.tensor(0.01) for a compiled "
                "optimizer) or keep it constant")
    if "type(" in text or "id(" in text or "___check_obj_id" in text:
        return "a different Python object reaches the compiled code on each call: pass the same object or a tensor"
    return "pass dynamic=True, pass changing Python numbers as tensors, or pad inputs to fixed sizes"


def graph_break_suggestion(reason: str) -> str:
    text = reason.lower()
    if ".item()" in text or "item" in text and "capture_scalar_outputs" in text:
        return ("remove .item() from the compiled code (keep the value a tensor; read it outside, and rarely), "
                "or set torch._dynamo.config.capture_scalar_outputs = True")
    if "print" in text or "logging" in text or "builtin operator" in text:
        return "move print/logging out of the compiled function (log outside it, every N steps)"
    if "backward" in text:
        return "compile the model (or its forward) and call loss.backward() outside the compiled function"
    if "data-dependent" in text or "generic_jump" in text or "jump" in text:
        return "replace data-dependent Python control flow with torch.where/torch.cond, or move it out of the compiled code"
    return "move the operation named out of the compiled code, or replace it with a traceable tensor operation"


@register
class CompileRecompilation(Check):
    """
    ## What it does
    Reads what dynamo records anyway, whatever ``TORCH_LOGS`` says (plain Python data; only
    when torch.compile was used): ``torch._dynamo.utils.counters``, the guard failures of
    every recompilation (``guard_failures``, the text ``TORCH_LOGS=recompiles`` would print)
    and the graph-break records (``graph_break_reasons``, with the user's stack where dynamo
    broke the graph). It also keeps dynamo's own "hit config.recompile_limit" warnings (a
    logging handler: what the user sees is not changed). It reports, once:

    - the **recompile limit** was hit: the function now runs in eager mode; the finding
      names the function, its line and the last guard that failed (a size, a Python value);
    - **repeated recompilation**: at least 4 recompilations and one for every 4 steps (or
      at least 8 new graphs, one for every two steps): the finding names the function (at
      its definition), the last guard that failed and, when dynamo names it, the user line
      that read the guarded value;
    - **graph breaks** in the user's code, in a run of at least 4 steps: the reason and the
      user's ``file:line`` of each (dynamo counts a break when it compiles; the compiled code
      then breaks there on every call).

    The fix follows the guard: a size mismatch → ``dynamic=True``/``mark_dynamic``/padding;
    ``value == 0.5`` on a Python number → pass a tensor; a break on ``.item()`` or ``print``
    → move it out of the compiled function.

    ## Why is this bad?
    A compiled function is specialised on what its guards check — shapes, dtypes, Python
    numbers. When a shape changes every batch (variable sequence lengths, a last smaller
    batch) or a Python scalar changes every step (a learning rate or step count passed as a
    float), each call recompiles, which takes seconds; after ``recompile_limit`` (8)
    compilations of a function dynamo gives up and runs it eagerly for the rest of the run —
    the speed-up is gone and nothing but a log line says so. Graph breaks split the step into
    several graphs with Python in between, losing most of the fusion.

    ## Example
    ```python
    @torch.compile(dynamic=False)
    def step(x, scale):
        return model(x) * scale
    for i, x in enumerate(loader):          # x.shape[0] varies; scale = 1.0 + i
        step(x, 1.0 + i)
    ```

    ## Use instead
    ```python
    @torch.compile(dynamic=True)            # or torch._dynamo.mark_dynamic(x, 0)
    def step(x, scale):
        ...
    step(x, torch.tensor(1.0 + i))          # a changing number as a tensor
    ```
    or pad batches to a few fixed sizes (``drop_last=True``, bucketing); log ``loss.item()``
    outside the compiled function. Thresholds: the limit is dynamo's own; 4 recompilations
    and one per 4 steps (a few recompilations for an evaluation shape or a last smaller
    batch stay silent); any graph break at a line of the user's code (breaks inside
    libraries are left to their authors).

    ## References
    - PyTorch docs, "Recompilation" (guards, dynamic shapes, ``recompile_limit``): https://docs.pytorch.org/docs/main/user_guide/torch_compiler/compile/programming_model.recompilation.html
    - PyTorch docs, ``torch.compile`` troubleshooting (graph breaks, ``TORCH_LOGS=recompiles``): https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html
    - PyTorch docs, dynamic shapes (``mark_dynamic``): https://pytorch.org/docs/stable/torch.compiler_dynamic_shapes.html
    - PyTorch tutorial, "Running the compiled optimizer with an LR Scheduler" (wrap the LR in a tensor to avoid recompiles): https://pytorch.org/tutorials/recipes/compiling_optimizer_lr_scheduler.html
    - PyTorch docs, "Common graph breaks" (``.item()``, ``print``): https://docs.pytorch.org/docs/main/compile/programming_model.common_graph_breaks.html
    """

    code = "P113"
    name = "compile-recompilation"
    severity = Severity.WARNING
    summary = "torch.compile recompiling repeatedly, hitting the limit, or graph breaks in the step"
    fix = "pass dynamic=True (or mark_dynamic), pass changing Python numbers as tensors, or pad to fixed sizes"
    needs = frozenset({"compile_log"})

    def __init__(self, session) -> None:
        super().__init__(session)
        self._before = CompileCounters.read() or CompileCounters()
        self._guard_baseline = guard_failure_counts()
        self._breaks_start = graph_break_count()
        self._reported = False

    @sampled_only
    def on_step_end(self, event: StepEnd) -> None:
        if not event.sampled:
            return
        # During the run only the limit is decided; recompilation and graph breaks are
        # judged over the whole run at its end (the limit, when it comes, names more).
        self._examine(event.step, event.location, final=False)

    def on_run_end(self, event: RunEnd) -> None:
        self._examine(event.step, event.location, final=True)

    def _examine(self, steps: int, fallback: Location | None, *, final: bool) -> None:
        if self._reported:
            return
        now = CompileCounters.read()
        if now is None:
            return
        delta = now.since(self._before)
        recompiled = recompilations_since(self._guard_baseline) if final or delta.limit_hits else []
        breaks = [(b, n) for b, n in graph_breaks_since(self._breaks_start) if b.location] if final else []
        verdict = compile_verdict(delta, steps, recompiles=sum(r.recompiles for r in recompiled),
                                  user_breaks=sum(n for _, n in breaks))
        if verdict is None or (verdict != "limit" and not final):
            return
        self._reported = True
        if verdict == "limit":
            self._report_limit(delta, steps, fallback, recompiled)
        elif verdict == "recompiling":
            self._report_recompiling(delta, steps, fallback, recompiled)
        else:
            self._report_breaks(steps, breaks)

    def _report_limit(self, delta: CompileCounters, steps: int, fallback: Location | None,
                      recompiled: list[Recompilation]) -> None:
        log = compile_log(self.session)
        message = log.limit_hits[0] if log is not None and log.limit_hits else ""
        function, location, reason = parse_limit_warning(message)
        worst = recompiled[0] if recompiled else None
        if worst is not None:
            function, location = function or worst.function, location or worst.definition
            reason = reason or worst.last_reason
        self.report(
            f"torch.compile hit its recompile limit{f' for {function}()' if function else ''}: after "
            f"{max(delta.unique_graphs, 1)} compiled graphs it now runs that function in eager mode"
            f"{f'; the last guard that failed: {reason}' if reason else ''}. Fix: {recompile_suggestion(reason)}.",
            location=location or fallback,
            evidence={"problem": "recompile_limit", "function": function, "last_reason": reason,
                      "graphs": delta.unique_graphs},
            fix=recompile_suggestion(reason),
            step=steps,
        )

    def _report_recompiling(self, delta: CompileCounters, steps: int, fallback: Location | None,
                            recompiled: list[Recompilation]) -> None:
        total = sum(r.recompiles for r in recompiled)
        worst = recompiled[0] if recompiled else None
        if worst is None:
            self.report(
                f"torch.compile compiled {delta.unique_graphs} graphs in {steps} steps: the compiled code "
                f"is recompiled again and again. Fix: {recompile_suggestion(None)}.",
                location=fallback,
                evidence={"problem": "recompiling", "graphs": delta.unique_graphs, "steps": steps},
                step=steps,
            )
            return
        read_at = f" (read at {worst.reason_location})" if worst.reason_location else ""
        fix = recompile_suggestion(worst.last_reason)
        self.report(
            f"torch.compile recompiled {worst.function}() {worst.recompiles} times in {steps} steps"
            f"{f' ({total} recompilations in all)' if total > worst.recompiles else ''}: the last guard that "
            f"failed was `{worst.last_reason}`{read_at}; each recompilation retraces the function "
            f"({delta.unique_graphs} graphs compiled). Fix: {fix}.",
            location=worst.definition,
            evidence={"problem": "recompiling", "function": worst.function, "recompiles": worst.recompiles,
                      "total_recompiles": total, "last_reason": worst.last_reason,
                      "reason_location": str(worst.reason_location) if worst.reason_location else None,
                      "graphs": delta.unique_graphs, "steps": steps},
            fix=fix,
            step=steps,
        )

    def _report_breaks(self, steps: int, breaks: list[tuple[GraphBreak, int]]) -> None:
        top = breaks[:3]
        first = top[0][0]
        places = "; ".join(f"{b.reason} at {b.location}" + (f" (×{n})" if n > 1 else "") for b, n in top)
        fixes = list(dict.fromkeys(graph_break_suggestion(b.reason) for b, _ in top))
        self.report(
            f"torch.compile broke the graph {sum(n for _, n in breaks)} time(s) in your code, and the compiled "
            f"code ran with those breaks for {steps} steps: {places}. Each break splits the step into "
            "separate graphs with Python (and for .item() a device synchronisation) in between, on every call.",
            location=first.location,
            evidence={"problem": "graph_breaks", "graph_breaks": sum(n for _, n in breaks),
                      "reasons": [b.reason for b, _ in top],
                      "locations": [str(b.location) for b, _ in top], "steps": steps},
            fix="; ".join(fixes),
            step=steps,
        )
