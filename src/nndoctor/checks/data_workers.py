"""DataLoader workers: D110 an IterableDataset read by every worker in full (no sharding)."""

from __future__ import annotations

import hashlib
import inspect
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import IterableDataset

from nndoctor.core.events import BatchFetched, EpochStart
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.user_code import display_path
from nndoctor.instrument.stats import first_tensor


def batch_fingerprint(batch: Any) -> bytes | None:
    """A cheap fingerprint of a batch: shape, dtype and up to 512 evenly spaced values of its
    first tensor (a strided view; no copy of the whole batch)."""
    tensor = first_tensor(batch)
    if tensor is None or tensor.device.type != "cpu" or tensor.numel() == 0:
        return None
    flat = tensor.detach().reshape(-1)
    stride = max(1, flat.numel() // 512)
    sample = flat[::stride][:512].contiguous()
    digest = hashlib.blake2b(digest_size=16)
    digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
    digest.update(sample.view(torch.uint8).numpy().tobytes())
    return digest.digest()


@dataclass
class WorkerDuplicates:
    """Fingerprints of one pass over a multi-worker IterableDataset loader.

    Workers of an IterableDataset yield batches in turn (batch ``i`` comes from worker
    ``i % workers``), so a dataset that every worker reads in full repeats each batch once
    per worker, each copy from a *different* worker.
    """

    workers: int
    first_seen: dict[bytes, int] = field(default_factory=dict)
    batches: int = 0
    cross_worker: int = 0
    same_worker: int = 0

    def add(self, fingerprint: bytes, index: int) -> None:
        self.batches += 1
        first = self.first_seen.get(fingerprint)
        if first is None:
            self.first_seen[fingerprint] = index
        elif first % self.workers != index % self.workers:
            self.cross_worker += 1
        else:
            self.same_worker += 1

    def verdict(self, min_duplicates: int = 4) -> bool:
        """Duplicated across workers, as often as unsharded workers make it (at least half
        of the expected ``1 - 1/workers`` share), and never within one worker (constant or
        repeated data would repeat within a worker too)."""
        if self.cross_worker < min_duplicates or self.same_worker:
            return False
        expected = 1 - 1 / self.workers
        return self.cross_worker / self.batches >= 0.5 * expected


def iter_definition(dataset: Any) -> Location | None:
    """``def __iter__`` of the dataset's class, when it is the user's code."""
    try:
        function = type(dataset).__iter__
        path = inspect.getsourcefile(function)
        _, line = inspect.getsourcelines(function)
    except (OSError, TypeError):
        return None
    if not path or "site-packages" in path or "dist-packages" in path:
        return None
    return Location(display_path(path), line)


@register
class IterableDatasetWorkerDuplicates(Check):
    """
    ## What it does
    For a DataLoader with ``num_workers ≥ 2`` over an ``IterableDataset``, fingerprints the
    first 256 batches of each pass (shape, dtype and up to 512 evenly spaced values of the
    first tensor — microseconds per batch; other loaders cost one cached lookup). Workers
    of an IterableDataset deliver batches in turn, so a dataset that every worker reads in
    full repeats each batch once per worker, each time from a different worker. It reports
    when at least 4 batches repeat a batch of *another* worker, at a rate of at least half
    what unsharded workers produce (``1 − 1/num_workers``), and no batch repeats within one
    worker (which would mean the data itself repeats).

    ## Why is this bad?
    Unlike a map-style dataset, an ``IterableDataset`` is not split between workers by the
    DataLoader: each worker process gets a copy and iterates it from the start. Without
    sharding in ``__iter__`` (``torch.utils.data.get_worker_info()``), every sample is seen
    ``num_workers`` times per epoch: epochs are ``num_workers`` times longer than intended,
    batches hold identical copies, and metrics computed per epoch are inflated.

    ## Example
    ```python
    class Stream(IterableDataset):
        def __iter__(self):
            yield from read_records(self.files)
    loader = DataLoader(Stream(files), batch_size=32, num_workers=4)
    ```

    ## Use instead
    ```python
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            files = self.files if info is None else self.files[info.id::info.num_workers]
            yield from read_records(files)
    ```
    (or ``torchdata``'s sharding filter / ``datasets``' ``split_dataset_by_node``).
    Thresholds: 4 cross-worker duplicate batches at ≥ half the expected rate, none within
    a worker.

    ## References
    - PyTorch docs, ``torch.utils.data.IterableDataset`` (each worker gets a replica; use ``get_worker_info`` to split): https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset
    - PyTorch docs, "Multi-process data loading": https://pytorch.org/docs/stable/data.html#multi-process-data-loading
    """

    code = "D110"
    name = "iterable-dataset-worker-duplicates"
    severity = Severity.ERROR
    summary = "an IterableDataset read by several workers without sharding: every sample repeats per worker"
    fix = "shard in __iter__ with torch.utils.data.get_worker_info() (each worker takes its id-th slice)"
    MAX_BATCHES = 256
    # Batches are looked at only while a pass over an eligible loader (an IterableDataset, two
    # workers or more) has batches left to fingerprint: the usual loader costs no call a batch.
    idle_handlers = ("batch",)

    def __init__(self, session) -> None:
        super().__init__(session)
        self._passes: weakref.WeakKeyDictionary[Any, WorkerDuplicates | None] = weakref.WeakKeyDictionary()
        self._reported: weakref.WeakSet[Any] = weakref.WeakSet()
        self._watching = False

    def on_epoch_start(self, event: EpochStart) -> None:
        loader = event.loader
        if loader is None or loader in self._reported:
            return
        workers = getattr(loader, "num_workers", 0) or 0
        eligible = workers >= 2 and isinstance(getattr(loader, "dataset", None), IterableDataset)
        self._passes[loader] = WorkerDuplicates(workers) if eligible else None
        self._watch_while_needed()

    def _watch_while_needed(self) -> None:
        needed = any(record is not None and record.batches < self.MAX_BATCHES for record in self._passes.values())
        if needed and not self._watching:
            self.session.arm(self, "batch")
        elif not needed and self._watching:
            self.session.disarm(self, "batch")
        self._watching = needed

    def on_batch(self, event: BatchFetched) -> None:
        loader = event.loader
        if loader is None:
            return
        record = self._passes.get(loader)
        if record is None or record.batches >= self.MAX_BATCHES:
            self._watch_while_needed()
            return
        fingerprint = batch_fingerprint(event.batch)
        if fingerprint is None:
            return
        record.add(fingerprint, event.index)
        if not record.verdict():
            return
        self._passes[loader] = None
        self._reported.add(loader)
        self._watch_while_needed()
        dataset = loader.dataset
        self.report(
            f"{type(dataset).__name__} (an IterableDataset) is read by {record.workers} DataLoader workers "
            f"without sharding: {record.cross_worker} of the first {record.batches} batches repeat a batch "
            f"another worker already delivered, so every sample is seen {record.workers} times per epoch.",
            location=iter_definition(dataset) or event.location,
            evidence={"dataset": type(dataset).__name__, "num_workers": record.workers,
                      "batches": record.batches, "duplicates_across_workers": record.cross_worker},
            step=event.step,
        )
