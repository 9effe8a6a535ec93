"""Facts for X106 (per-device losses summed instead of averaged); the check decides.

- ``DataParallel.gather`` is wrapped: when every device returned a 0-dim tensor at some
  position of its output (a model that computes its own loss), ``gather`` stacks them into
  a vector with one entry per device. The vector's autograd node is annotated (its
  ``metadata`` dict gets the number of devices and the user's line: plain values, freed
  with the graph; nodes cannot be weakly referenced) so the check can recognise it when a
  backward's graph reaches it.
- ``torch.distributed.all_reduce`` (in place, not differentiable) and
  ``torch.distributed.nn.functional.all_reduce`` (differentiable, returns the sum) are
  wrapped: a one-element floating tensor in the autograd graph reduced with ``SUM`` across
  several ranks is remembered (weakly), with its value before and after. Calling ``backward`` on that sum is what the check reports; an
  in-place division in between (``loss /= world``) makes it a mean again.

Only plain values and weak references are kept; nothing is computed on the user's tensors
except reading the one-element value before and after the reduction.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nndoctor.core.stash import StashKey

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol

GATHERED_KEY = "nndoctor.gathered_device_losses"


@dataclass
class SummedLoss:
    """A loss all-reduced with SUM across ranks (plain values and a weak reference)."""

    tensor: weakref.ref
    version: int
    world_size: int
    local: float
    reduced: float
    location: Any  # the user's Location of the all_reduce call
    step: int
    differentiable: bool  # torch.distributed.nn.functional.all_reduce: gradients are summed too
    reported: bool = False


@dataclass
class LossSumFacts:
    summed: list[SummedLoss] = field(default_factory=list)
    # Per-device loss vectors annotated so far: without one, no backward graph can reach one,
    # and X106 need not walk the graph on every step.
    gathered: int = 0
    # Called at each new fact (X106 arms its backward handler: until then no backward needs it).
    listeners: list[Callable[[], None]] = field(default_factory=list)

    def changed(self) -> None:
        for listener in self.listeners:
            listener()


LOSS_SUM_FACTS = StashKey[LossSumFacts]("losses summed across devices or ranks")


def facts(session: Any) -> LossSumFacts:
    return session.stash.get_or_create(LOSS_SUM_FACTS, LossSumFacts)


def scalar_positions(per_device: list[Any], gathered: Any) -> list[Any]:
    """The tensors of ``gathered`` built from a 0-dim tensor on every device (same walk as
    torch's gather: tensors, then dicts/lists/tuples position by position)."""
    import torch

    first = per_device[0]
    if isinstance(first, torch.Tensor):
        scalar = all(isinstance(o, torch.Tensor) and o.dim() == 0 for o in per_device)
        return [gathered] if scalar and isinstance(gathered, torch.Tensor) and first.is_floating_point() else []
    found: list[Any] = []
    if isinstance(first, dict) and hasattr(gathered, "items"):
        for key in first:
            if all(isinstance(o, dict) and key in o for o in per_device) and key in gathered:
                found += scalar_positions([o[key] for o in per_device], gathered[key])
    elif isinstance(first, (list, tuple)) and isinstance(gathered, (list, tuple)):
        for i, item in enumerate(gathered):
            if all(isinstance(o, (list, tuple)) and len(o) > i for o in per_device):
                found += scalar_positions([o[i] for o in per_device], item)
    return found


def _is_sum(op: Any) -> bool:
    import torch.distributed as dist

    return op is None or op == dist.ReduceOp.SUM


def install(installation: InstallationProtocol) -> None:
    try:
        import torch.distributed as dist
        from torch.nn.parallel import DataParallel
    except ImportError:  # pragma: no cover - torch without distributed
        return
    session = installation.session
    patcher = installation.patcher
    state = facts(session)

    original_gather = DataParallel.gather

    @functools.wraps(original_gather)
    def gather(self, outputs, output_device):
        result = original_gather(self, outputs, output_device)
        if session.active and len(outputs) >= 2:
            try:
                from nndoctor.instrument.location import user_location

                for vector in scalar_positions(list(outputs), result):
                    if vector.grad_fn is not None:
                        where = user_location(sys._getframe(1))
                        vector.grad_fn.metadata[GATHERED_KEY] = {
                            "devices": len(outputs), "shape": list(vector.shape),
                            "path": where.path if where else None, "line": where.line if where else None}
                        state.gathered += 1
                        state.changed()
            except Exception as error:  # noqa: BLE001 - observer rule
                session.internal_error("DataParallel gather record", error)
        return result

    patcher.patch(DataParallel, "gather", gather)

    if not dist.is_available():
        return
    original_all_reduce = dist.all_reduce

    @functools.wraps(original_all_reduce)
    def all_reduce(tensor, op=None, group=None, async_op=False):
        candidate = None
        if session.active:
            try:
                candidate = _loss_before_reduce(session, state, tensor, op, group)
            except Exception as error:  # noqa: BLE001 - observer rule
                session.internal_error("all_reduce loss record", error)
        kwargs = {"group": group, "async_op": async_op}
        result = (original_all_reduce(tensor, op=op, **kwargs) if op is not None
                  else original_all_reduce(tensor, **kwargs))
        if candidate is not None and not async_op:
            try:
                _record_sum(session, state, tensor, tensor, candidate, sys._getframe(1), differentiable=False)
            except Exception as error:  # noqa: BLE001 - observer rule
                session.internal_error("all_reduce loss record", error)
        return result

    patcher.patch(dist, "all_reduce", all_reduce)
    _patch_functional_all_reduce(session, patcher, state)


def _patch_functional_all_reduce(session: Any, patcher: Any, state: LossSumFacts) -> None:
    try:
        import torch.distributed.nn.functional as functional
    except ImportError:  # pragma: no cover - torch without distributed autograd functions
        return
    original = functional.all_reduce

    @functools.wraps(original)
    def all_reduce(tensor, op=None, group=None):
        candidate = None
        if session.active:
            try:
                candidate = _loss_before_reduce(session, state, tensor, op, group)
            except Exception as error:  # noqa: BLE001 - observer rule
                session.internal_error("all_reduce loss record", error)
        kwargs = {"group": group} if op is None else {"op": op, "group": group}
        result = original(tensor, **kwargs)
        if candidate is not None:
            try:
                _record_sum(session, state, tensor, result, candidate, sys._getframe(1), differentiable=True)
            except Exception as error:  # noqa: BLE001 - observer rule
                session.internal_error("all_reduce loss record", error)
        return result

    patcher.patch(functional, "all_reduce", all_reduce)


def _loss_before_reduce(session: Any, state: LossSumFacts, tensor: Any, op: Any, group: Any) -> tuple | None:
    """(world size, local value) when ``tensor`` is a one-element value in the autograd graph
    (so it can be back-propagated: a loss) being summed over several ranks. Detached copies
    reduced for logging are not looked at (no extra read, no sync)."""
    import torch
    import torch.distributed as dist

    if not isinstance(tensor, torch.Tensor) or not tensor.requires_grad or tensor.numel() != 1:
        return None
    if not _is_sum(op) or not tensor.is_floating_point() or not dist.is_initialized():
        return None
    world = dist.get_world_size(group)
    if world < 2:
        return None
    return world, float(tensor.detach().reshape(()).item())


def _record_sum(session: Any, state: LossSumFacts, source: Any, summed: Any, candidate: tuple, frame: Any,
                *, differentiable: bool) -> None:
    from nndoctor.instrument.location import user_location

    world, local = candidate
    state.summed = [s for s in state.summed if s.tensor() is not None][-7:]
    state.summed.append(SummedLoss(
        tensor=weakref.ref(summed), version=summed._version, world_size=world, local=local,
        reduced=float(summed.detach().reshape(()).item()), location=user_location(frame), step=session.step,
        differentiable=differentiable))
    state.changed()


def pending_for(state: LossSumFacts, tensor: Any) -> SummedLoss | None:
    """The summed-loss record of ``tensor`` if it still holds the undivided sum."""
    for record in state.summed:
        alive = record.tensor()
        if not record.reported and alive is not None and alive is tensor:
            return record if alive._version == record.version else None
    return None
