"""X checks: distributed data-parallel training (torch.distributed, DistributedDataParallel).

Two kinds. Checks that one rank can decide alone (sampler epoch, forward bypassing the DDP
wrapper, parameters changed after wrapping, accumulation without ``no_sync``, small
per-rank BatchNorm batches) report from the rank's events. Checks that need several ranks
(same batches on every rank, diverged parameters, one file written by several ranks) record
plain numbers on sampled steps (``rank_data``) and compare them when the ranks' reports are
merged (``cross_rank_findings``): no extra collective is ever issued into the user's
process group, so the checks cannot hang or reorder the user's communication.
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections.abc import Iterable
from typing import Any

from nndoctor.core.findings import Finding, Location, Severity
from nndoctor.core.registry import Check, all_checks, is_enabled, register
from nndoctor.core.subscribers import model_forwards_only, sampled_only, sampled_training_forwards
from nndoctor.run.distributed.parts import rank_data

_MAX_RECORDED_BATCHES = 64
_MAX_RECORDED_STEPS = 32
_BN_SMALL_BATCH = 16


def _is_ddp(module: Any) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return False
    return isinstance(module, DistributedDataParallel)


def _fsdp_unsharded(module: Any) -> bool:
    """An FSDP (1) wrapper with the NO_SHARD strategy: every rank holds every parameter."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    wrapper = getattr(fsdp, "FullyShardedDataParallel", None) if fsdp is not None else None
    if wrapper is None or not isinstance(module, wrapper):
        return False
    strategy = getattr(getattr(module, "sharding_strategy", None), "name", None)
    return strategy == "NO_SHARD"


def _location_json(location: Location | None) -> dict[str, Any] | None:
    return location.to_json() if location is not None else None


def _location_from_json(data: dict[str, Any] | None) -> Location | None:
    return Location(data["path"], data.get("line")) if data else None


def _world_size() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - no process group: one process
        pass
    return 1


class CrossRankCheck(Check):
    """A check decided by comparing what several ranks recorded (at merge time)."""

    @classmethod
    def compare(cls, parts: list[dict[str, Any]]) -> list[Finding]:  # pragma: no cover - abstract
        # Every registered cross-rank check overrides this; reaching it is a programming error.
        raise TypeError(f"{cls.__name__} must define compare()")


def cross_rank_findings(parts: list[dict[str, Any]], select: Iterable[str] = (),
                        ignore: Iterable[str] = ()) -> list[Finding]:
    """The findings of every enabled cross-rank check over the ranks' parts."""
    select, ignore = list(select), list(ignore)
    found: list[Finding] = []
    # From the registry, not a list here: X110 lives in checks/stall.py, which imports this module.
    for cls in all_checks():
        if issubclass(cls, CrossRankCheck) and is_enabled(cls, select, ignore):
            found.extend(cls.compare(parts))
    return found


# -- X101 ----------------------------------------------------------------------------------
def batch_fingerprint(stats: Any) -> list[Any] | None:
    """Shape, mean, std, min and max of a batch's first tensor: equal on two ranks only when
    they read the same samples (the order inside a batch does not change it)."""
    if stats is None:
        return None
    return [list(stats.shape), stats.mean, stats.std, stats.min, stats.max]


def identical_batch_keys(per_rank: dict[int, dict[str, list[Any]]]) -> tuple[int, int]:
    """(batches compared on every rank, of which identical on every rank)."""
    ranks = list(per_rank)
    if len(ranks) < 2:
        return 0, 0
    common = set.intersection(*(set(per_rank[r]) for r in ranks))
    same = sum(1 for key in common if all(per_rank[r][key] == per_rank[ranks[0]][key] for r in ranks))
    return len(common), same


@register
class MissingDistributedSampler(CrossRankCheck):
    """
    ## What it does
    Compares a fingerprint (shape, mean, std, min, max) of the training batches every rank
    received on sampled steps. When all ranks got the very same batches, the loader is not
    splitting the data between ranks.

    ## Why is this bad?
    With DistributedDataParallel each rank must see a different shard of the data. Without a
    `DistributedSampler` (or an equivalent split) every rank reads the same samples: N GPUs do
    the work of one, an epoch is not an epoch, and the effective batch is N copies of the
    same batch.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=32, shuffle=True)   # same order on every rank
    model = DDP(model)
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
    ```

    ## References
    - PyTorch docs, DistributedSampler: https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler
    - PyTorch tutorial, Getting Started with DDP: https://pytorch.org/tutorials/intermediate/ddp_tutorial.html
    """

    code = "X101"
    name = "missing-distributed-sampler"
    severity = Severity.ERROR
    summary = "every rank reads the same samples"
    fix = "give the DataLoader a DistributedSampler(dataset) (and call sampler.set_epoch(epoch) each epoch)"

    # Armed by a fingerprinted batch (sampled steps), disarmed by the backward that trains on it.
    idle_handlers = ("backward",)

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._last_key: str | None = None

    @sampled_only
    def on_batch(self, event: Any) -> None:
        if not event.sampled:
            return
        data = rank_data(self.session)
        batches = data.setdefault("batches", {})
        if len(batches) >= _MAX_RECORDED_BATCHES:
            return
        from nndoctor.instrument.stats import cached_stats, first_tensor

        tensor = first_tensor(event.batch)
        if tensor is None:
            return
        location = event.location
        key = f"{location}|{event.epoch}|{event.index}"
        # The same statistics the forward's input checks compute (shared per tensor and step).
        fingerprint = batch_fingerprint(cached_stats(event, "batch0", tensor))
        if fingerprint is None:
            return
        batches[key] = fingerprint
        sampler = getattr(event.loader, "sampler", None)
        data.setdefault("batch_sites", {})[str(location)] = {
            "location": _location_json(location), "sampler": type(sampler).__name__,
        }
        self._last_key = key
        self.session.arm(self, "backward")

    def on_backward(self, event: Any) -> None:
        # Only batches that were trained on count: evaluating the whole validation set on
        # every rank is wasteful but not this bug.
        self.session.disarm(self, "backward")
        if self._last_key is not None:
            rank_data(self.session).setdefault("trained_batches", []).append(self._last_key)
            self._last_key = None

    @classmethod
    def compare(cls, parts: list[dict[str, Any]]) -> list[Finding]:
        per_rank: dict[int, dict[str, list[Any]]] = {}
        for part in parts:
            data = part.get("data") or {}
            trained = set(data.get("trained_batches", []))
            per_rank[part["rank"]] = {k: v for k, v in data.get("batches", {}).items() if k in trained}
        compared, same = identical_batch_keys(per_rank)
        if compared < 2 or same < compared:
            return []
        first_key = sorted(set.intersection(*(set(b) for b in per_rank.values())))[0]
        site = first_key.split("|", 1)[0]
        info = (parts[0].get("data") or {}).get("batch_sites", {}).get(site, {})
        ranks = sorted(per_rank)
        finding = cls.finding(
            f"All {len(ranks)} ranks trained on identical batches: {same} of {compared} sampled "
            f"training batches have the same fingerprint (shape, mean, std, min, max) on every "
            f"rank. The DataLoader's sampler is {info.get('sampler', 'unknown')}, not a "
            "DistributedSampler, so each rank reads the same samples.",
            location=_location_from_json(info.get("location")),
            evidence={"ranks": ranks, "batches_compared": compared, "identical_batches": same,
                      "sampler": info.get("sampler")},
        )
        finding.ranks = ranks
        return [finding]


# -- X102 ----------------------------------------------------------------------------------
@register
class SamplerEpochNotSet(Check):
    """
    ## What it does
    Watches every DataLoader whose sampler is a shuffling `DistributedSampler`: when a new pass
    over it starts and the sampler's epoch is still the value of the previous pass,
    `sampler.set_epoch(epoch)` was not called.

    ## Why is this bad?
    `DistributedSampler` seeds its shuffle with `seed + epoch`. Without `set_epoch`, every
    epoch visits the samples in exactly the same order on every rank, which removes the
    benefit of shuffling and can hurt convergence.

    ## Example
    ```python
    sampler = DistributedSampler(dataset, shuffle=True)
    for epoch in range(epochs):
        for x, y in DataLoader(dataset, sampler=sampler): ...
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader: ...
    ```

    ## References
    - PyTorch docs, DistributedSampler ("calling set_epoch() at the beginning of each epoch
      ... is necessary to make shuffling work properly across multiple epochs"):
      https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler
    """

    code = "X102"
    name = "sampler-epoch-not-set"
    severity = Severity.WARNING
    summary = "DistributedSampler.set_epoch never called"
    fix = "call sampler.set_epoch(epoch) at the start of every epoch"
    idle_handlers = ("step_end",)  # called from a pass's start (on_epoch_start) to its first step

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        # sampler -> the epoch of its last pass that trained (an optimizer step happened in it)
        self._trained_epoch: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        # sampler -> (epoch at the start of its latest pass, where that pass started), until
        # that pass trains
        self._pending: weakref.WeakKeyDictionary[Any, tuple[int, Location | None, int]] = (
            weakref.WeakKeyDictionary())

    def on_epoch_start(self, event: Any) -> None:
        from torch.utils.data.distributed import DistributedSampler

        sampler = getattr(event.loader, "sampler", None)
        if isinstance(sampler, DistributedSampler) and getattr(sampler, "shuffle", False):
            self._pending[sampler] = (int(getattr(sampler, "epoch", 0)), event.location, event.epoch)
            self.session.arm(self, "step_end")

    def on_step_end(self, event: Any) -> None:
        # A pass counts once it trains: evaluating on the same loader within an epoch (same
        # sampler epoch, no optimizer step) is not an epoch of its own.
        self.session.disarm(self, "step_end")  # called again once the next pass starts
        for sampler, (epoch, location, passes) in list(self._pending.items()):
            del self._pending[sampler]
            previous = self._trained_epoch.get(sampler)
            self._trained_epoch[sampler] = epoch
            if previous is None or previous != epoch:
                continue
            self.report(
                f"A new training pass over the DataLoader (pass {passes + 1}) started with its "
                f"DistributedSampler still at epoch {epoch}, like the previous training pass: "
                "set_epoch() was not called, so every epoch shuffles the samples into the same "
                "order on every rank.",
                location=location,
                evidence={"sampler_epoch": epoch, "pass": passes + 1,
                          "seed": getattr(sampler, "seed", None)},
                step=event.step,
            )


# -- X103 ----------------------------------------------------------------------------------
@register
class UnsyncedBatchNorm(Check):
    """
    ## What it does
    On a sampled training forward through `DistributedDataParallel` with more than one rank,
    looks for BatchNorm layers that are not `SyncBatchNorm` while each rank's batch holds
    fewer than 16 samples.

    ## Why is this bad?
    Under DDP each plain BatchNorm normalises with the statistics of its own rank's batch
    only. With few samples per rank those statistics are noisy, which is known to hurt
    accuracy noticeably below about 16 samples per batch (Wu & He, 2018); `SyncBatchNorm`
    computes them over the global batch.

    ## Example
    ```python
    model = DDP(resnet50())          # BatchNorm2d, 8 images per GPU
    ```

    ## Use instead
    ```python
    model = nn.SyncBatchNorm.convert_sync_batchnorm(resnet50())
    model = DDP(model)
    ```

    ## References
    - PyTorch docs, SyncBatchNorm: https://pytorch.org/docs/stable/generated/torch.nn.SyncBatchNorm.html
    - Wu & He, "Group Normalization" (2018), Fig. 1: https://arxiv.org/abs/1803.08494
    """

    code = "X103"
    name = "unsynced-batchnorm"
    severity = Severity.WARNING
    heuristic = True
    summary = "BatchNorm (not SyncBatchNorm) with small or class-skewed per-rank batches"
    fix = "convert with nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP"

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._done: weakref.WeakSet[Any] = weakref.WeakSet()

    @sampled_only
    def on_forward(self, event: Any) -> None:
        module = event.module
        if not (event.sampled and event.training and event.grad_enabled) or not _is_ddp(module):
            return
        if module in self._done:
            return
        world = _world_size()
        if world < 2:
            return
        from torch.nn import SyncBatchNorm
        from torch.nn.modules.batchnorm import _BatchNorm

        from nndoctor.instrument.stats import first_tensor

        tensor = first_tensor(event.inputs)
        if tensor is None or tensor.dim() == 0:
            return
        batch = int(tensor.shape[0])
        layers = [name for name, m in module.module.named_modules()
                  if isinstance(m, _BatchNorm) and not isinstance(m, SyncBatchNorm) and m.training]
        self._done.add(module)
        if not layers or batch >= _BN_SMALL_BATCH:
            return
        self.report(
            f"{len(layers)} BatchNorm layer(s) (e.g. {layers[0]}) normalise each rank's batch of "
            f"{batch} samples on its own ({world} ranks, global batch {batch * world}): below "
            f"{_BN_SMALL_BATCH} samples per batch the statistics are noisy. SyncBatchNorm would use "
            f"all {batch * world}.",
            location=event.location,
            evidence={"per_rank_batch": batch, "world_size": world, "batchnorm_layers": layers[:8],
                      "threshold": _BN_SMALL_BATCH},
            step=event.step,
        )


# -- X104 ----------------------------------------------------------------------------------
def first_divergence(per_rank: dict[int, dict[str, list[float]]], names: list[str],
                     rel_tol: float = 1e-6) -> tuple[int, str, dict[int, float]] | None:
    """(step, parameter, its checksum per rank) of the first parameter that differs."""
    ranks = sorted(per_rank)
    if len(ranks) < 2:
        return None
    steps = sorted(set.intersection(*(set(per_rank[r]) for r in ranks)), key=int)
    for step in steps:
        values = [per_rank[r][step] for r in ranks]
        for i, name in enumerate(names):
            column = [v[i] for v in values if i < len(v)]
            if len(column) < len(ranks):
                continue
            top = max(abs(c) for c in column)
            if max(column) - min(column) > rel_tol * max(top, 1e-12):
                return int(step), name, dict(zip(ranks, column))
    return None


@register
class RankDivergence(CrossRankCheck):
    """
    ## What it does
    After `optimizer.step()` on sampled steps, every rank records a cheap checksum (the L2
    norm) of each parameter of its replicated model — a `DistributedDataParallel` model, an
    FSDP model with the `NO_SHARD` strategy, or a model whose every parameter was sent with
    `dist.broadcast` (hand-rolled data parallelism); the checksums are compared across ranks
    when the reports are merged, naming the first parameter and step where they differ.
    Sharded FSDP parameters are not compared: each rank holds a different shard by design.

    ## Why is this bad?
    Data-parallel replicas stay identical only if every rank applies the same update to the
    same starting weights. A rank-dependent learning rate, an LR scheduler stepped on one rank
    only, a parameter changed on one rank, or a parameter the reducer does not know about makes
    the replicas drift apart silently: the model each rank saves or evaluates is different.

    ## Example
    ```python
    optimizer = SGD(model.parameters(), lr=0.1 * (rank + 1))
    if rank == 0:
        scheduler.step()             # hand-rolled data parallelism: only rank 0 decays its LR
    ```

    ## Use instead
    Use the same optimizer settings on every rank and step the scheduler on every rank,
    change parameters only before wrapping in DDP, and let DDP broadcast the initial weights.

    ## References
    - PyTorch notes, Distributed Data Parallel (replicas stay in sync because every rank
      applies the same averaged gradients): https://pytorch.org/docs/stable/notes/ddp.html
    - PyTorch tutorial, Writing distributed applications (data parallelism by hand: broadcast
      the parameters, all-reduce the gradients): https://pytorch.org/tutorials/intermediate/dist_tuto.html
    """

    code = "X104"
    name = "rank-divergence"
    severity = Severity.ERROR
    summary = "parameters of a replicated model (DDP, FSDP NO_SHARD, broadcast) differ across ranks"
    fix = "apply the same update on every rank: same optimizer settings and scheduler steps, no rank-conditional parameter changes"

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._broadcast_roots: weakref.WeakSet[Any] = weakref.WeakSet()

    def replicated_model(self) -> tuple[Any, str] | None:
        """The model every rank holds a full copy of, and how it is replicated: a DDP wrapper's
        module, an FSDP model that does not shard (NO_SHARD), or a model whose every parameter
        was broadcast by hand. Sharded FSDP parameters differ across ranks by design."""
        roots = list(self.session.state.roots)
        for module in roots:
            if _is_ddp(module):
                return module.module, "DDP"
        for module in roots:
            if _fsdp_unsharded(module):
                return module, "FSDP (NO_SHARD)"
        from nndoctor.instrument.ddp_hooks import broadcast_addresses

        addresses = broadcast_addresses(self.session)
        if not addresses or _world_size() < 2:
            return None
        for module in roots:
            if module in self._broadcast_roots:
                return module, "parameters broadcast from one rank"
            params = [p for p in module.parameters() if p.requires_grad]
            if params and all(p.data_ptr() in addresses for p in params):
                self._broadcast_roots.add(module)
                return module, "parameters broadcast from one rank"
        return None

    @sampled_only
    def on_step_end(self, event: Any) -> None:
        if not event.sampled:
            return
        data = rank_data(self.session)
        checksums = data.setdefault("param_checksums", {})
        if len(checksums) >= _MAX_RECORDED_STEPS:
            return
        found = self.replicated_model()
        if found is None:
            return
        model, how = found
        import torch

        named = [(n, p) for n, p in model.named_parameters()]
        if not named:
            return
        with torch.no_grad():
            norms = torch._foreach_norm([p.detach() for _, p in named])
            # One stack and one conversion (not one .float() per parameter): half precision
            # converts to double exactly either way, so the values are the same.
            values = torch.stack(norms).double().cpu().tolist()
        checksums[str(event.step)] = values
        if "param_names" not in data:
            data["param_names"] = [n for n, _ in named]
            data["step_location"] = _location_json(event.location)
            data["replicated_by"] = how

    @classmethod
    def compare(cls, parts: list[dict[str, Any]]) -> list[Finding]:
        per_rank = {p["rank"]: (p.get("data") or {}).get("param_checksums", {}) for p in parts}
        per_rank = {r: v for r, v in per_rank.items() if v}
        names = next(((p.get("data") or {}).get("param_names") for p in parts
                      if (p.get("data") or {}).get("param_names")), None)
        if len(per_rank) < 2 or not names:
            return []
        found = first_divergence(per_rank, names)
        if found is None:
            return []
        step, name, values = found
        location = next((_location_from_json((p.get("data") or {}).get("step_location")) for p in parts
                         if (p.get("data") or {}).get("step_location")), None)
        shown = ", ".join(f"rank {r}: {v:.6g}" for r, v in values.items())
        how = next(((p.get("data") or {}).get("replicated_by") for p in parts
                    if (p.get("data") or {}).get("replicated_by")), "DDP")
        kind = "DDP replicas" if how == "DDP" else f"model replicas ({how})"
        finding = cls.finding(
            f"The {kind} diverged: after optimizer step {step} parameter {name} differs "
            f"across ranks (L2 norm {shown}). Replicas stay identical only when every rank "
            "applies the same update.",
            location=location,
            evidence={"step": step, "parameter": name, "norm_by_rank": {str(k): v for k, v in values.items()},
                      "replicated_by": how},
        )
        finding.first_step = step
        finding.ranks = sorted(values)
        return [finding]


# -- X105 ----------------------------------------------------------------------------------
@register
class RankUnsafeIO(CrossRankCheck):
    """
    ## What it does
    Records the files each rank writes with `torch.save`; when the ranks' reports are merged,
    a path written by several ranks on the same host is reported.

    ## Why is this bad?
    Every rank writing the same checkpoint races: the file can be truncated or interleaved
    while another rank writes or reads it, and N ranks do N times the I/O for one file.

    ## Example
    ```python
    torch.save(model.state_dict(), "checkpoint.pt")      # on every rank
    ```

    ## Use instead
    ```python
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "checkpoint.pt")
    dist.barrier()                                        # others wait before reading it
    ```

    ## References
    - PyTorch tutorial, DDP "Save and Load Checkpoints": https://pytorch.org/tutorials/intermediate/ddp_tutorial.html#save-and-load-checkpoints
    """

    code = "X105"
    name = "rank-unsafe-io"
    severity = Severity.WARNING
    summary = "every rank writes the same checkpoint/log path"
    fix = "write from rank 0 only (if dist.get_rank() == 0: torch.save(...)), then dist.barrier()"

    def on_checkpoint_save(self, event: Any) -> None:
        if not event.path:
            return
        saves = rank_data(self.session).setdefault("saves", {})
        path = os.path.abspath(str(event.path))
        entry = saves.setdefault(path, {"count": 0, "location": _location_json(event.location),
                                        "step": event.step, "time": time.time()})
        entry["count"] += 1

    @classmethod
    def compare(cls, parts: list[dict[str, Any]]) -> list[Finding]:
        writers: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = {}
        for part in parts:
            for path, entry in ((part.get("data") or {}).get("saves") or {}).items():
                writers.setdefault((part.get("host", ""), path), []).append((part["rank"], entry))
        findings = []
        for (_, path), entries in sorted(writers.items()):
            if len(entries) < 2:
                continue
            ranks = sorted(r for r, _ in entries)
            first = entries[0][1]
            finding = cls.finding(
                f"{len(ranks)} ranks wrote the same file {path} with torch.save (ranks "
                f"{', '.join(map(str, ranks))}, {sum(e['count'] for _, e in entries)} writes): "
                "they race on one file.",
                location=_location_from_json(first.get("location")),
                evidence={"path": path, "ranks": ranks, "writes": {str(r): e["count"] for r, e in entries}},
            )
            finding.first_step = min(e.get("step", 0) for _, e in entries)
            finding.ranks = ranks
            findings.append(finding)
        return findings


# -- X107 ----------------------------------------------------------------------------------
@register
class DdpForwardBypass(Check):
    """
    ## What it does
    Reports a training forward (grad enabled, training mode) called directly on a module that
    is wrapped by `DistributedDataParallel` — `model.module(x)` instead of `model(x)`. Looked
    for on sampled steps (the first 16, then periodically): a loop's forward is the same call
    on every step.

    ## Why is this bad?
    DDP prepares its gradient all-reduce in its own `forward`. A forward through the inner
    module skips it: the gradients of that step are not averaged across ranks, the replicas
    drift apart, and with `find_unused_parameters` the next step can fail.

    ## Example
    ```python
    model = DDP(net)
    loss = loss_fn(model.module(x), y)
    ```

    ## Use instead
    ```python
    loss = loss_fn(model(x), y)     # call the DDP wrapper while training
    ```

    ## References
    - PyTorch docs, DistributedDataParallel: https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
    - PyTorch notes, DDP internal design (forward pass prepares the reducer): https://pytorch.org/docs/stable/notes/ddp.html#internal-design
    """

    code = "X107"
    name = "ddp-forward-bypass"
    severity = Severity.ERROR
    summary = "forward through the inner module instead of the DDP wrapper while training"
    fix = "call the DDP wrapper (model(x)), not model.module(x), for training forwards"
    idle_handlers = ("forward",)  # until a DDP wrapper is built: the usual single-process run has none

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        from nndoctor.instrument.ddp_hooks import registry

        self._registry = registry(session)
        self._registry.on_built.append(lambda: session.arm(self, "forward"))

    @sampled_training_forwards  # the unsampled steps' training forwards repeat the sampled ones'
    @model_forwards_only
    def on_forward(self, event: Any) -> None:
        if event.is_loss or not (event.training and event.grad_enabled) or event.inference_mode:
            return
        record = self._registry.by_inner.get(event.module)
        if record is None or record.ddp() is None:
            return
        self.report(
            f"A training forward called {type(event.module).__name__} directly although it is "
            f"wrapped by DistributedDataParallel (built at {record.location}): DDP's forward, which "
            "prepares the gradient all-reduce, was skipped, so this step's gradients are not "
            "averaged across ranks.",
            location=event.location,
            evidence={"module": type(event.module).__name__, "ddp_built_at": record.location,
                      "grad_enabled": True, "training": True},
            step=event.step,
        )


# -- X108 ----------------------------------------------------------------------------------
def param_changes(before: dict[int, tuple], after: dict[int, tuple]) -> dict[str, list[str]]:
    """Parameters added, replaced or moved (device/dtype/shape) since the wrapper was built."""
    added = [after[i][0] for i in after if i not in before]
    replaced = [before[i][0] for i in before if i not in after]
    moved = [f"{after[i][0]} ({before[i][2]} {before[i][3]}{list(before[i][1])} -> "
             f"{after[i][2]} {after[i][3]}{list(after[i][1])})"
             for i in after if i in before and before[i][1:] != after[i][1:]]
    return {k: v for k, v in (("added", added), ("replaced", replaced), ("moved", moved)) if v}


@register
class ParamsChangedAfterWrap(Check):
    """
    ## What it does
    Remembers the parameters a `DistributedDataParallel` wrapper was built with (identity,
    shape, device, dtype) and, on sampled training forwards through it, reports parameters
    added, replaced or moved since.

    ## Why is this bad?
    DDP registers its gradient hooks and all-reduce buckets on the parameters it sees at
    construction. A layer replaced afterwards (a new head, `module.fc = nn.Linear(...)`) is
    trained without gradient averaging, so ranks diverge; a parameter moved or cast after
    wrapping breaks the buckets' views.

    ## Example
    ```python
    model = DDP(net)
    model.module.fc = nn.Linear(512, 10)      # after wrapping
    ```

    ## Use instead
    ```python
    net.fc = nn.Linear(512, 10)               # finish the model (and .to(device)) first
    model = DDP(net)
    ```

    ## References
    - PyTorch docs, DistributedDataParallel ("you should never try to change your model's
      parameters after wrapping up your model with DistributedDataParallel"):
      https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
    """

    code = "X108"
    name = "params-changed-after-wrap"
    severity = Severity.ERROR
    summary = "parameters added, replaced or moved after DDP was built"
    fix = "finish building the model (layers, .to(device), dtype) before wrapping it in DDP"

    @sampled_only
    def on_forward(self, event: Any) -> None:
        module = event.module
        if not (event.sampled and event.training and event.grad_enabled) or not _is_ddp(module):
            return
        from nndoctor.instrument.ddp_hooks import param_signature, registry

        record = registry(self.session).by_wrapper.get(module)
        if record is None or record.checked_changes:
            return
        changes = param_changes(record.params, param_signature(module.module))
        if not changes:
            return
        record.checked_changes = True
        described = "; ".join(f"{kind}: {', '.join(names[:4])}" + (" …" if len(names) > 4 else "")
                              for kind, names in changes.items())
        self.report(
            f"The DistributedDataParallel model's parameters changed after it was built at "
            f"{record.location} ({described}): DDP only all-reduces the gradients of the "
            "parameters it saw at construction.",
            location=event.location,
            evidence={"ddp_built_at": record.location, **{k: v[:16] for k, v in changes.items()}},
            step=event.step,
        )


# -- X109 ----------------------------------------------------------------------------------
@register
class AccumulationWithoutNoSync(Check):
    """
    ## What it does
    On sampled steps, counts the backward passes between two `optimizer.step()` calls on a
    `DistributedDataParallel` model and whether their forwards ran inside `no_sync()`. When
    every micro-step of an accumulation all-reduced its gradients, it reports the redundant
    all-reduces, the gradient bytes each one moves and the measured backward time.

    ## Why is this bad?
    With gradient accumulation only the last micro-step's gradients need averaging. Outside
    `no_sync()`, DDP all-reduces the full gradients after every micro-step: k micro-steps cost
    k all-reduces instead of one, which dominates the step time on slow interconnects.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        loss_fn(model(x), y).backward()
        if (i + 1) % 4 == 0:
            optimizer.step(); optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    context = model.no_sync() if (i + 1) % 4 else contextlib.nullcontext()
    with context:
        loss_fn(model(x), y).backward()
    ```

    ## References
    - PyTorch docs, DistributedDataParallel.no_sync: https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html#torch.nn.parallel.DistributedDataParallel.no_sync
    """

    code = "X109"
    name = "accumulation-without-no-sync"
    severity = Severity.WARNING
    summary = "gradient accumulation under DDP all-reducing every micro-step"
    fix = "run the forward and backward of every micro-step but the last inside model.no_sync()"

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._forwards: list[bool] = []  # synced? per DDP training forward since the last step
        self._forwards_step = -1  # the step they belong to
        self._backward_started: float | None = None
        self._backward_s: list[float] = []
        self._location: Location | None = None
        self._grad_bytes = 0

    @sampled_only
    def on_forward(self, event: Any) -> None:
        module = event.module
        if not (event.sampled and event.training and event.grad_enabled) or not _is_ddp(module):
            return
        if event.step != self._forwards_step:  # a sampled step whose optimizer never stepped left some
            self._forwards, self._backward_s, self._location = [], [], None
            self._forwards_step = event.step
        self._forwards.append(bool(getattr(module, "require_backward_grad_sync", True)))
        if not self._grad_bytes:
            self._grad_bytes = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)

    # ``_forwards`` fills on sampled forwards only and empties at every step_start: a backward
    # that finds it non-empty belongs to the same, sampled, step (and so does its backward_done).
    @sampled_only
    def on_backward(self, event: Any) -> None:
        if not event.sampled:
            return
        if self._forwards:
            self._backward_started = time.perf_counter()
            if self._location is None:
                self._location = event.location

    @sampled_only
    def on_backward_done(self, event: Any) -> None:
        if not event.sampled:
            return
        if self._backward_started is not None:
            self._backward_s.append(time.perf_counter() - self._backward_started)
            self._backward_started = None

    # The lists fill on sampled steps only, and a step's forwards, backwards and step_start
    # share its step number: an unsampled step_start has nothing to read or clear.
    @sampled_only
    def on_step_start(self, event: Any) -> None:
        if not event.sampled:
            return
        forwards, backward_s, location = self._forwards, self._backward_s, self._location
        self._forwards, self._backward_s, self._location = [], [], None
        if event.backwards_since_step < 2 or len(forwards) < 2:
            return
        if not all(forwards):
            return
        micro = event.backwards_since_step
        mean_ms = 1000 * sum(backward_s) / len(backward_s) if backward_s else None
        megabytes = self._grad_bytes / 1e6
        timing = f"; each backward (with its all-reduce) took {mean_ms:.1f} ms on average" if mean_ms else ""
        self.report(
            f"{micro} backward passes were accumulated before optimizer.step() and every one "
            f"all-reduced its gradients ({megabytes:.2f} MB each): {micro - 1} of the {micro} "
            f"all-reduces are redundant{timing}. Only the last micro-step needs to synchronise.",
            location=location or event.location,
            evidence={"micro_steps": micro, "redundant_allreduces": micro - 1,
                      "gradient_mb_per_allreduce": round(megabytes, 3),
                      "mean_backward_ms": round(mean_ms, 2) if mean_ms else None},
            step=event.step,
        )


# -- X111 ----------------------------------------------------------------------------------
@register
class UnreducedEvalMetric(Check):
    """
    ## What it does
    In a process group of several ranks, notes each evaluation pass (model in eval mode or
    gradients disabled) over a DataLoader whose `DistributedSampler` gives this rank only its
    shard. If no `torch.distributed` collective (all_reduce, all_gather, reduce, ... — also
    those called by torchmetrics or accelerate) runs from the start of that pass until training
    resumes or the run ends, the evaluation result was never combined across ranks.

    ## Why is this bad?
    Each rank then reports the metric of its own 1/N of the validation set: rank 0's log shows
    a number computed on a fraction of the data, noisier than it looks, and different from
    what the other ranks computed.

    ## Example
    ```python
    for x, y in val_loader:                     # DistributedSampler: this rank's shard
        correct += (model(x).argmax(1) == y).sum()
    if rank == 0:
        print(correct / len(val_loader.dataset))
    ```

    ## Use instead
    ```python
    totals = torch.tensor([correct, seen], device=device)
    dist.all_reduce(totals)
    accuracy = totals[0] / totals[1]
    ```

    ## References
    - PyTorch docs, torch.distributed.all_reduce: https://pytorch.org/docs/stable/distributed.html#torch.distributed.all_reduce
    - torchvision reference training script (reduces evaluation metrics across processes): https://github.com/pytorch/vision/blob/main/references/classification/utils.py
    """

    code = "X111"
    name = "unreduced-eval-metric"
    severity = Severity.WARNING
    heuristic = True
    summary = "per-rank evaluation metrics reported without a reduction"
    fix = "all_reduce the evaluation sums and counts (or all_gather the predictions) before reporting"
    # forward: from a sharded pass's start to its first forward; step_end: from an evaluation
    # forward to the next step (or the run's end)
    idle_handlers = ("forward", "step_end")

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._candidate: tuple[Location | None, int, int] | None = None  # a sharded pass just started
        self._open: tuple[Location | None, int, int, int] | None = None  # an eval pass, not yet reduced

    def _collectives(self) -> int:
        from nndoctor.instrument.ddp_hooks import collective_state

        return collective_state(self.session).count

    def on_epoch_start(self, event: Any) -> None:
        from torch.utils.data.distributed import DistributedSampler

        sampler = getattr(event.loader, "sampler", None)
        self._candidate = None
        if isinstance(sampler, DistributedSampler) and sampler.num_replicas > 1 and _world_size() > 1:
            self._candidate = (event.location, int(sampler.num_replicas), event.step)
            self.session.arm(self, "forward")

    @model_forwards_only
    def on_forward(self, event: Any) -> None:
        if self._candidate is None or event.is_loss:
            return
        location, replicas, step = self._candidate
        self._candidate = None
        self.session.disarm(self, "forward")
        if not (event.training and event.grad_enabled) and self._open is None:
            self._open = (location, replicas, step, self._collectives())
            self.session.arm(self, "step_end")

    def on_step_end(self, event: Any) -> None:
        self._close()
        self.session.disarm(self, "step_end")

    def on_run_end(self, event: Any) -> None:
        self._close()

    def _close(self) -> None:
        if self._open is None:
            return
        location, replicas, step, before = self._open
        self._open = None
        if self._collectives() > before:
            return
        self.report(
            f"An evaluation pass over this rank's shard (DistributedSampler, 1/{replicas} of the data) "
            "was followed by no torch.distributed collective before training resumed or the run "
            "ended: its metrics were never combined across ranks, so each rank reports a number "
            f"computed on 1/{replicas} of the evaluation set.",
            location=location,
            evidence={"num_replicas": replicas, "collectives_after_eval": 0},
            step=step,
        )


# -- X112 ----------------------------------------------------------------------------------
def sampler_padding(sampler: Any) -> tuple[int, int, int] | None:
    """(dataset length, replicas, duplicated samples) when a DistributedSampler pads, else None."""
    from torch.utils.data.distributed import DistributedSampler

    if not isinstance(sampler, DistributedSampler) or getattr(sampler, "drop_last", False):
        return None
    dataset: Any = sampler.dataset  # a map-style dataset: sized, or TypeError
    try:
        length = len(dataset)
    except TypeError:
        return None
    padded = int(sampler.total_size) - length
    return (length, int(sampler.num_replicas), padded) if padded > 0 else None


@register
class EvalSamplerPadding(Check):
    """
    ## What it does
    Reports an evaluation pass (model in eval mode or gradients disabled) over a DataLoader whose
    `DistributedSampler` pads the dataset: its length is not a multiple of the number of ranks,
    so the sampler repeats samples to give every rank the same count.

    ## Why is this bad?
    The repeated samples are evaluated twice; a metric reduced across ranks then counts them
    twice and is biased — slightly, but enough to make results irreproducible across world
    sizes and to disagree with a single-GPU evaluation.

    ## Example
    ```python
    val_sampler = DistributedSampler(val_set, shuffle=False)   # 10_001 samples on 4 ranks
    ```

    ## Use instead
    Evaluate on one rank, or drop the padded duplicates before reducing (count only the first
    `len(dataset)` indices), or split the indices without padding (`indices[rank::world_size]`)
    and reduce sums and counts.

    ## References
    - PyTorch docs, DistributedSampler (`drop_last=False` adds extra indices so the data is
      evenly divisible): https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler
    - torchvision reference training script (warns when the validation used more samples than
      the dataset has): https://github.com/pytorch/vision/blob/main/references/classification/train.py
    """

    code = "X112"
    name = "eval-sampler-padding"
    severity = Severity.WARNING
    summary = "DistributedSampler padding duplicates evaluation samples"
    fix = "evaluate without padded duplicates: count only the dataset's own samples, or evaluate on one rank"
    idle_handlers = ("forward",)  # called from a padded pass's start to its first forward

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._pass: tuple[tuple[int, int, int], Location | None, int] | None = None

    def on_epoch_start(self, event: Any) -> None:
        padding = sampler_padding(getattr(event.loader, "sampler", None))
        self._pass = (padding, event.location, event.step) if padding else None
        if padding:
            self.session.arm(self, "forward")

    @model_forwards_only
    def on_forward(self, event: Any) -> None:
        if self._pass is None or event.is_loss:
            return
        (length, replicas, padded), location, step = self._pass
        self._pass = None  # one decision per pass: the first forward says whether it evaluates
        self.session.disarm(self, "forward")
        if event.training and event.grad_enabled:
            return
        self.report(
            f"This evaluation pass iterates a DistributedSampler that pads: {length} samples on "
            f"{replicas} ranks become {length + padded}, so {padded} sample(s) are evaluated twice "
            "and a metric reduced across ranks counts them twice.",
            location=location,
            evidence={"dataset_length": length, "num_replicas": replicas, "duplicated_samples": padded},
            step=step,
        )


# -- X113 ----------------------------------------------------------------------------------
_STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


@register
class RankDied(CrossRankCheck):
    """
    ## What it does
    Under `torchrun`, each rank notes cheaply (in a memory-mapped file, like NCCL's flight
    recorder) its last optimizer step, its backward passes and every `torch.distributed`
    collective it enters: operation, element count, dtype and your line. When a rank dies
    without running any Python — SIGKILL (the kernel's out-of-memory killer, a scheduler), a
    segfault, or a C++ abort such as gloo's `EnforceNotMet` or NCCL's watchdog — the surviving
    ranks merge the report anyway and name the dead rank, its signal, what it was doing and,
    when torchrun keeps the rank's output (`--redirects`/`--tee` with `--log-dir`), its native
    error message.

    ## Why is this bad?
    A rank that dies this way prints no Python traceback; torchrun then stops every other rank,
    whose errors ("Connection reset by peer", a collective timeout) point away from the cause.
    The dead rank's last collective and native error are what say why the job failed.

    ## Example
    ```python
    if rank == 0:
        dist.all_reduce(total)     # rank 1 is already in DDP's gradient all-reduce: gloo aborts
    ```

    ## Use instead
    Call every collective on every rank in the same order; for a rank killed by the kernel,
    lower its host-memory use (fewer DataLoader workers, no full dataset copy per rank).

    ## References
    - PyTorch docs, torchrun (`--redirects`, `--tee`, `--log-dir`): https://pytorch.org/docs/stable/elastic/run.html
    - PyTorch docs, debugging torch.distributed applications: https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications
    - PyTorch docs, NCCL flight recorder: https://pytorch.org/docs/stable/torch_nccl_debugging.html
    """

    code = "X113"
    name = "rank-died"
    severity = Severity.ERROR
    summary = "a rank died without Python (signal, segfault, native abort): its last step and collective"
    fix = "read the dead rank's native error and last collective above; run torchrun with --redirects 3 --log-dir DIR to keep each rank's output"

    @classmethod
    def compare(cls, parts: list[dict[str, Any]]) -> list[Finding]:
        from nndoctor.run.distributed.positions import describe_position, location_of

        found = []
        several_hosts = len({p.get("host") for p in parts}) > 1
        for part in parts:
            died = part.get("died")
            # SIGTERM / SIGINT / SIGHUP stop a process on purpose: the launcher (mp.spawn,
            # torchrun) stopping the other ranks after one failed, or the user.
            if not died or died.get("signal") in _STOP_SIGNALS:
                continue
            flight = died.get("flight")
            signal_name = died.get("signal")
            how = (f"{signal_name} (inferred: it left no part and no fatal-signal trace, so nothing "
                   "in the process could react)") if died.get("signal_inferred") else signal_name
            native = died.get("native_error")
            if native:
                native_text = f" Its last native error: {' '.join(native.split())[:400]}"
            elif died.get("torchrun"):
                native_text = (" Its native error text was not kept (run torchrun with --redirects 3 "
                               "--log-dir DIR to keep it).")
            else:
                native_text = " Any native error text it printed went to its stderr."
            host = f" on {part.get('host')}" if several_hosts else ""
            finding = cls.finding(
                f"Rank {part.get('rank')} (pid {part.get('pid')}{host}) died of {how} "
                f"without running Python, {describe_position(flight)}.{native_text}",
                location=location_of(flight),
                evidence={"rank": part.get("rank"), "signal": signal_name,
                          "signal_inferred": bool(died.get("signal_inferred")),
                          "last_step": (flight or {}).get("step"), "flight": flight,
                          "native_error": native, "fatal_trace": died.get("fatal_trace")},
            )
            finding.ranks = [int(part.get("rank") or 0)]
            finding.first_step = (flight or {}).get("step")
            found.append(finding)
        return found


__all__ = ["cross_rank_findings"]
