"""torch.compile behaviour: P113 recompilation, the recompile limit, graph breaks."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any

from nndoctor.events import RunEnd, StepEnd
from nndoctor.findings import Location, Severity
from nndoctor.instrument.training_probe import compile_log
from nndoctor.registry import Check, register
from nndoctor.user_code import display_path


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


def compile_verdict(delta: CompileCounters, steps: int, *, min_graphs: int = 8,
                    min_breaks_per_step: float = 1.0) -> str | None:
    """Which problem the counters show since the run started (None: healthy)."""
    if delta.limit_hits > 0:
        return "limit"
    if steps >= 4 and delta.unique_graphs >= min_graphs and delta.unique_graphs >= steps / 2:
        return "recompiling"
    total_breaks = sum(delta.graph_breaks.values())
    if steps >= 4 and total_breaks >= min_breaks_per_step * steps:
        return "graph_breaks"
    return None


def _suggestion(reason: str | None) -> str:
    text = (reason or "").lower()
    if "size mismatch" in text or "shape" in text or "stride" in text:
        return ("the input shapes change between calls: pass dynamic=True, mark the varying dimension with "
                "torch._dynamo.mark_dynamic(x, dim), or pad inputs to a few fixed sizes")
    if "==" in text or "type(" in text or "id(" in text or "value" in text:
        return ("a Python number or object the function reads changes between calls: pass it as a tensor "
                "(torch.tensor(value)) or keep it constant")
    return "pass dynamic=True, pass changing Python numbers as tensors, or pad inputs to fixed sizes"


@register
class CompileRecompilation(Check):
    """
    ## What it does
    Reads ``torch._dynamo.utils.counters`` (plain Python counters; only when torch.compile
    was used) at sampled optimizer steps (for the limit) and at the end of the run (for
    the rest), and keeps dynamo's own
    "hit config.recompile_limit" warnings (a logging handler: what the user sees is not
    changed). It reports, once:

    - the **recompile limit** was hit: the function now runs in eager mode; the finding
      names the function, its line and the last guard that failed (a size, a Python value);
    - **repeated recompilation**: at least 8 new graphs, and at least one for every two
      steps;
    - **graph breaks** in the training step: at least one per step, with the most frequent
      reasons.

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
    or pad batches to a few fixed sizes (``drop_last=True``, bucketing). Thresholds: the
    limit is dynamo's own; 8 graphs and one per two steps for recompilation; one graph
    break per step.

    ## References
    - PyTorch docs, "Recompilation" (guards, dynamic shapes, ``recompile_limit``): https://docs.pytorch.org/docs/main/user_guide/torch_compiler/compile/programming_model.recompilation.html
    - PyTorch docs, ``torch.compile`` troubleshooting (graph breaks, ``TORCH_LOGS=recompiles``): https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html
    - PyTorch docs, dynamic shapes (``mark_dynamic``): https://pytorch.org/docs/stable/torch.compiler_dynamic_shapes.html
    """

    code = "P113"
    name = "compile-recompilation"
    severity = Severity.WARNING
    summary = "torch.compile recompiling repeatedly, hitting the limit, or graph breaks in the step"
    fix = "pass dynamic=True (or mark_dynamic), pass changing Python numbers as tensors, or pad to fixed sizes"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._before = CompileCounters.read() or CompileCounters()
        self._reported = False

    def on_step_end(self, event: StepEnd) -> None:
        if event.sampled:
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
        verdict = compile_verdict(delta, steps)
        if verdict is None or (verdict != "limit" and not final):
            return
        self._reported = True
        if verdict == "limit":
            log = compile_log(self.session)
            message = log.limit_hits[0] if log is not None and log.limit_hits else ""
            function, location, reason = parse_limit_warning(message)
            self.report(
                f"torch.compile hit its recompile limit{f' for {function}()' if function else ''}: after "
                f"{max(delta.unique_graphs, 1)} compiled graphs it now runs that function in eager mode"
                f"{f'; the last guard that failed: {reason}' if reason else ''}. Fix: {_suggestion(reason)}.",
                location=location or fallback,
                evidence={"problem": "recompile_limit", "function": function, "last_reason": reason,
                          "graphs": delta.unique_graphs},
                step=steps,
            )
        elif verdict == "recompiling":
            self.report(
                f"torch.compile compiled {delta.unique_graphs} graphs in {steps} steps: the compiled code "
                "is recompiled again and again (guards on changing shapes or Python values). Fix: "
                f"{_suggestion(None)}.",
                location=fallback,
                evidence={"problem": "recompiling", "graphs": delta.unique_graphs, "steps": steps},
                step=steps,
            )
        else:
            top = sorted(delta.graph_breaks.items(), key=lambda kv: -kv[1])[:3]
            reasons = "; ".join(f"{first_line(reason)} (×{count})" for reason, count in top)
            self.report(
                f"torch.compile broke the graph {sum(delta.graph_breaks.values())} times in {steps} steps: "
                f"{reasons}. Each break splits the step into separate graphs with Python in between.",
                location=fallback,
                evidence={"problem": "graph_breaks", "graph_breaks": sum(delta.graph_breaks.values()),
                          "reasons": [first_line(r) for r, _ in top], "steps": steps},
                fix="remove the operations named (print, .item(), data-dependent Python control flow) from the "
                    "compiled code, or move them outside it",
                step=steps,
            )
