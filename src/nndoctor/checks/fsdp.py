"""FSDP mistakes: an optimizer built before sharding, a sharded state dict saved with torch.save.

Both are decided on this rank alone from what the model and the optimizer hold (``DTensor``
parameters of FSDP2's ``fully_shard``, ``FlatParameter`` of ``FullyShardedDataParallel``): no
collective is issued.
"""

from __future__ import annotations

import weakref
from typing import Any

from nndoctor.checks._params import optimizer_params
from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import sampled_only
from nndoctor.util.dtensor import is_dtensor


def is_fsdp_parameter(p: Any) -> bool:
    """A parameter FSDP manages: a DTensor (FSDP2) or a FlatParameter (FSDP 1)."""
    return is_dtensor(p) or type(p).__name__ == "FlatParameter"


def _sharded_values(obj: Any, limit: int = 10_000) -> tuple[int, int, str | None]:
    """(DTensor values, all tensor values, the first DTensor's key) in a (nested) state dict."""
    from collections import deque

    import torch

    sharded, total, first = 0, 0, None
    queue: deque[tuple[str, Any]] = deque([("", obj)])
    while queue and total < limit:
        key, value = queue.popleft()
        if isinstance(value, dict):
            queue.extend((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            queue.extend((f"{key}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, torch.Tensor):
            total += 1
            if is_dtensor(value):
                sharded += 1
                first = first or key
    return sharded, total, first


@register
class OptimizerBeforeSharding(Check):
    """
    ## What it does
    At the first `optimizer.step()` of each optimizer, looks at the model being trained: when
    its parameters are managed by FSDP (`fully_shard`'s DTensor parameters, or the
    `FlatParameter`s of `FullyShardedDataParallel`) but none of the optimizer's parameters is
    one of them, the optimizer was built from the model's parameters *before* sharding.

    ## Why is this bad?
    Sharding replaces the model's parameters with new ones. An optimizer built before holds
    the old tensors, which no longer take part in the forward pass and never receive a
    gradient: `step()` updates nothing the model uses and training silently does nothing.

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.parameters())
    fully_shard(model)                     # or model = FSDP(model)
    ```

    ## Use instead
    ```python
    fully_shard(model)                     # or model = FSDP(model)
    optimizer = torch.optim.AdamW(model.parameters())
    ```

    ## References
    - PyTorch docs, FullyShardedDataParallel ("The optimizer must be initialized after the
      module has been wrapped, since FSDP will shard parameters in-place and this will break any
      previously initialized optimizers"): https://pytorch.org/docs/stable/fsdp.html
    - huggingface/accelerate issue 3256 (training stalls: AdamW built before FSDP wrapping): https://github.com/huggingface/accelerate/issues/3256
    - PyTorch tutorial, Getting Started with FSDP2 (`fully_shard` first, then the optimizer): https://pytorch.org/tutorials/intermediate/FSDP_tutorial.html
    """

    code = "X114"
    name = "optimizer-before-sharding"
    severity = Severity.ERROR
    summary = "optimizer built before fully_shard / FSDP wrapping: it updates the replaced parameters"
    fix = "build the optimizer after fully_shard(model) / FSDP(model), from the sharded model's parameters"
    needs = frozenset({"construction_sites"})  # the optimizer's line

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()

    # The first steps of every optimizer are sampled (``Session.step_sampled``): its first
    # step, the one this looks at, is never an unsampled one.
    @sampled_only
    def on_step_start(self, event: Any) -> None:
        if not event.sampled:
            return
        optimizer = event.optimizer
        if optimizer in self._seen:
            return
        self._seen.add(optimizer)
        roots = list(self.session.state.roots)
        model_params = {id(p): p for root in roots for p in root.parameters()}
        sharded = [p for p in model_params.values() if is_fsdp_parameter(p)]
        held = optimizer_params(optimizer)
        if not sharded or not held or any(id(p) in model_params for p in held):
            return
        if any(is_fsdp_parameter(p) for p in held):
            return  # built from another sharded model: not this mistake
        from nndoctor.instrument.numerics_probe import construction_site

        built = construction_site(self.session, optimizer)
        where = f" (built at {built})" if built else ""
        self.report(
            f"{type(optimizer).__name__}{where} holds {len(held)} parameter tensor(s), none of which is "
            f"in the model being trained, whose {len(sharded)} parameters are FSDP-sharded "
            f"({type(sharded[0]).__name__}): the optimizer was built before sharding, so its step() "
            "updates the replaced tensors and the model never changes.",
            location=built or event.location,
            evidence={"optimizer": type(optimizer).__name__, "optimizer_params": len(held),
                      "sharded_model_params": len(sharded), "sharded_type": type(sharded[0]).__name__},
            step=event.step,
        )


@register
class ShardedStateDictSaved(Check):
    """
    ## What it does
    Watches `torch.save`: when the object saved is a state dict whose tensors are FSDP2
    `DTensor` shards (what `model.state_dict()` returns after `fully_shard`), it reports how
    many of the tensors are sharded.

    ## Why is this bad?
    Each rank holds only its shard. `torch.save(model.state_dict(), path)` writes this rank's
    shards with their sharding metadata: saved on rank 0 only, the file lacks the other ranks'
    shards; loaded without the same process group and device mesh, it cannot be used as
    ordinary weights (`load_state_dict` in a plain model fails or needs the whole group).

    ## Example
    ```python
    fully_shard(model)
    ...
    if rank == 0:
        torch.save(model.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(state, "model.pt")          # full tensors (call on every rank)
    # or, sharded on every rank: torch.distributed.checkpoint.save(...)
    ```

    ## References
    - PyTorch docs, torch.distributed.checkpoint (DCP) and `get_model_state_dict`: https://pytorch.org/docs/stable/distributed.checkpoint.html
    - PyTorch tutorial, Getting Started with FSDP2 (state dicts with DTensor): https://pytorch.org/tutorials/intermediate/FSDP_tutorial.html
    """

    code = "X115"
    name = "sharded-state-dict-saved"
    severity = Severity.WARNING
    summary = "torch.save of an FSDP2 state dict of DTensor shards"
    fix = ("gather a full state dict with get_model_state_dict(model, options=StateDictOptions("
           "full_state_dict=True, cpu_offload=True)) on every rank, or save with torch.distributed.checkpoint")

    def on_checkpoint_save(self, event: Any) -> None:
        if not isinstance(event.obj, dict):
            return
        sharded, total, first = _sharded_values(event.obj)
        if not sharded:
            return
        self.report(
            f"torch.save wrote a state dict in which {sharded} of {total} tensors are DTensor shards "
            f"(e.g. {first}): the file holds only this rank's part of each, with its sharding, "
            "not the model's weights.",
            location=event.location,
            evidence={"sharded_tensors": sharded, "tensors": total, "first_key": first,
                      "path": event.path},
            step=event.step,
        )
