"""Memory leaks through autograd graphs: P108 retained-loss-graph."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch

from nndoctor.core.events import LossComputed, StepEnd
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import sampled_only


class _GraphToken:
    """Stored in a loss's ``grad_fn.metadata``: it dies with the autograd node, so a weak
    reference to it tells whether the graph is still alive (nodes themselves cannot be
    weakly referenced)."""

    __slots__ = ("__weakref__",)


_TOKEN_KEY = "nndoctor.retained_graph"


def _dead_ref() -> None:
    """Stands for the token's weak reference when a node could not hold one."""
    return None
_GRAPH_WALK_LIMIT = 4096  # nodes visited per candidate variable when naming the holder


def graph_node_ids(tensor: torch.Tensor, limit: int = _GRAPH_WALK_LIMIT) -> set[int]:
    """ids of the autograd nodes reachable from ``tensor`` (bounded breadth-first walk)."""
    seen: set[int] = set()
    frontier = [tensor.grad_fn] if tensor.grad_fn is not None else []
    while frontier and len(seen) < limit:
        node = frontier.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        frontier.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
    return seen


def graph_holder(namespaces: list[dict], node_ids: set[int]) -> str | None:
    """The name of a tensor variable whose graph reaches one of ``node_ids``."""
    for namespace in namespaces:
        for name, value in list(namespace.items()):
            if isinstance(value, torch.Tensor) and value.grad_fn is not None and graph_node_ids(value) & node_ids:
                return name
    return None


def accumulation_line(frame, name: str) -> int | None:
    """The line of ``name += …`` / ``name = … name …`` in the function running in ``frame``."""
    import inspect
    import linecache
    import re

    code = frame.f_code
    if code.co_name == "<module>":  # getsourcelines gives a module's first statement only
        lines, first = linecache.getlines(code.co_filename, frame.f_globals), 1
    else:
        try:
            lines, first = inspect.getsourcelines(code)
        except (OSError, TypeError):
            return None
    word = re.escape(name)
    # name += …, name -= …, or name = <expression using name> (an exponential average).
    pattern = re.compile(rf"^\s*{word}\s*(?:[-+*/]=|=(?!=).*\b{word}\b)")
    for offset, line in enumerate(lines):
        if pattern.match(line):
            return first + offset
    return None


@register
class RetainedLossGraph(Check):
    """
    ## What it does
    Follows the losses of sampled steps (every step of the first 16, then one in 100) that
    carry an autograd graph: the tensor through a weak reference, and its graph through a
    token stored in the graph's output node (``grad_fn.metadata``), which dies with the node.
    At each sampled optimizer step it counts the losses from more than ``2`` steps ago whose
    tensor or graph is still alive: something in the user's code holds on to them. Two shapes of the bug are told apart:

    - the **tensors** are alive: they are kept (``losses.append(loss)``);
    - the tensors are gone but their **graphs** are alive: another tensor chains them — a
      running sum ``running_loss += loss`` builds one graph that reaches every step's loss.
      nndoctor then looks for the tensor variable (in the frame that called
      ``optimizer.step()``, and its globals) whose graph reaches the old losses, names it,
      and points at its ``+=`` line.

    ## Why is this bad?
    ``losses.append(loss)`` (instead of ``loss.item()``) keeps every step's tensor — and
    with it the autograd graph and, until backward frees them, the saved activations —
    alive for the whole run. ``running_loss += loss`` keeps every step's graph nodes in one
    ever-growing chain (and, for a loss that is never backpropagated, such as a validation
    loss computed with gradients on, all of its activations). Memory grows every step until
    an out-of-memory error that seems to come from nowhere (PyTorch FAQ,
    "accumulating history across your training loop").

    ## Example
    ```python
    losses, running_loss = [], 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        losses.append(loss)
        running_loss += loss
    ```

    ## Use instead
    ```python
        losses.append(loss.item())        # or loss.detach()
        running_loss += loss.item()
    ```
    The threshold — at least ``3`` losses older than two steps still alive — leaves room
    for the ordinary ``loss`` variable of the current and previous iteration. Not seen:
    losses written by hand (``((pred - y) ** 2).mean()``), which are not loss functions.

    ## References
    - PyTorch FAQ, "My model reports cuda runtime error(2): out of memory" (accumulating history): https://pytorch.org/docs/stable/notes/faq.html
    """

    code = "P108"
    name = "retained-loss-graph"
    severity = Severity.WARNING
    summary = "loss tensors or their graphs kept alive across steps (losses.append(loss), running_loss += loss)"
    fix = "store loss.item() (or loss.detach()) instead of the loss tensor, and sum loss.item() into running totals"
    AGE = 2
    MIN_ALIVE = 3
    MAX_TRACKED = 512

    def __init__(self, session) -> None:
        super().__init__(session)
        # (step, tensor ref, token ref, id of the graph's output node, location)
        self._losses: list[tuple[int, weakref.ref, Callable[[], object], int, Location | None]] = []
        self._reported = False

    @sampled_only
    def on_loss(self, event: LossComputed) -> None:
        out = event.output
        if not event.sampled or self._reported or not isinstance(out, torch.Tensor) or out.grad_fn is None:
            return
        if len(self._losses) < self.MAX_TRACKED:
            token = _GraphToken()
            node: Any = out.grad_fn
            token_ref: Callable[[], object]
            try:
                node.metadata[_TOKEN_KEY] = token
                token_ref = weakref.ref(token)
            except (AttributeError, RuntimeError, TypeError):  # a node type without metadata
                token_ref = _dead_ref
            self._losses.append((event.step, weakref.ref(out), token_ref, id(node), event.location))

    @sampled_only
    def on_step_end(self, event: StepEnd) -> None:
        if not event.sampled or self._reported or not self._losses:
            return
        cutoff = event.step - self.AGE
        old = [entry for entry in self._losses if entry[0] < cutoff]
        tensors = [entry for entry in old if entry[1]() is not None]
        graphs = [entry for entry in old if entry[1]() is None and entry[2]() is not None]
        # Forget the dead, so the list stays short on a correct program.
        self._losses = [entry for entry in self._losses if entry[1]() is not None or entry[2]() is not None]
        if len(tensors) + len(graphs) < self.MIN_ALIVE:
            return
        self._reported = True
        self._losses = []
        if len(tensors) >= len(graphs):
            self.report(
                f"{len(tensors)} loss tensors from earlier steps (the oldest from step {tensors[0][0]}) are still "
                "alive with their autograd graphs: the code keeps references to them "
                "(e.g. losses.append(loss)), so memory grows every step.",
                location=tensors[0][4],
                evidence={"alive_old_losses": len(tensors), "oldest_step": tensors[0][0], "step": event.step,
                          "kept": "tensors"},
                step=event.step,
            )
            return
        self._report_chained_graphs(event, graphs)

    def _report_chained_graphs(self, event: StepEnd, graphs: list) -> None:
        from nndoctor.core.user_code import user_frame

        frame = user_frame(event.frame)  # the user's code that called optimizer.step()
        node_ids = {entry[3] for entry in graphs}
        holder = line = None
        if frame is not None:
            local_vars = frame.f_locals
            function_frame = local_vars is not frame.f_globals
            try:
                holder = graph_holder([local_vars] + ([frame.f_globals] if function_frame else []), node_ids)
            finally:
                if function_frame and sys.version_info < (3, 13):
                    # Before 3.13, f_locals of a function frame is a snapshot dict stored on
                    # the frame, holding every local until the function returns: empty it so
                    # nothing of the user's stays alive through us. (Tracers and locals()
                    # refresh it from the frame before reading it.)
                    local_vars.clear()
                del local_vars
            if holder is not None:
                line = accumulation_line(frame, holder)
        location = graphs[0][4]
        if line is not None and event.location is not None:
            location = Location(event.location.path, line)
        who = (f"the tensor `{holder}` reaches them through its autograd graph" if holder
               else "another tensor reaches them through its autograd graph")
        self.report(
            f"the autograd graphs of {len(graphs)} losses from earlier steps (the oldest from step "
            f"{graphs[0][0]}) are still alive although the loss tensors are gone: {who} — a running "
            f"sum such as `{holder or 'running_loss'} += loss` chains every step's graph into one that "
            "grows every step.",
            location=location,
            evidence={"alive_old_graphs": len(graphs), "oldest_step": graphs[0][0], "step": event.step,
                      "kept": "graphs", "holder": holder},
            step=event.step,
        )
