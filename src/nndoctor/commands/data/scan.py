"""Run the probes over all files with a process pool, the cache and bounded memory.

The main process walks the folders (streamed), answers what it can from the cache, sends the
rest to workers in small batches with a bounded number in flight, and writes each result to
the scan index. Per-file results are never all held in memory; only per-split sums (channel
moments) and per-class counters are.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from nndoctor.commands.data.cache import ScanCache
from nndoctor.commands.data.filechecks import per_file_issues, record_issues
from nndoctor.commands.data.index import ScanIndex
from nndoctor.commands.data.layout import FileTask, Plan, Split, WalkProblems, display, iter_files
from nndoctor.commands.data.probe import PROBE_VERSION, FileRecord, probe_batch
from nndoctor.commands.data.progress import ScanProgress
from nndoctor.commands.data.readers import numpy_arrays
from nndoctor.commands.data.record_probe import plan_source, probe_units
from nndoctor.commands.data.records import ReadOptions, Unit
from nndoctor.commands.data.storage import is_url
from nndoctor.commands.data.tfrecord import TFRECORD_VERSION, scan_tfrecord, valid_summary

IMAGE_BATCH = 32  # files per worker task: amortises pickling without starving a worker
IN_FLIGHT_PER_WORKER = 4  # batches queued per worker: keeps workers busy, memory bounded


@dataclass
class ScanOptions:
    workers: int = 0  # 0: all cores
    use_cache: bool = True
    progress: bool | None = None  # None: only when stderr is a terminal
    read: ReadOptions = field(default_factory=ReadOptions)  # --images / --labels
    engine: str = "local"  # local (process pool) or ray
    address: str | None = None  # the Ray cluster, for engine="ray"


@dataclass
class SplitTotals:
    """Running sums for one split: enough for F108 and F113 without per-file memory."""

    files: int = 0
    images: int = 0
    moments: list[float] = field(default_factory=lambda: [0.0] * 6)
    class_images: Counter = field(default_factory=Counter)
    labels: Counter = field(default_factory=Counter)  # records per label, readable or not


@dataclass
class ScanResult:
    plan: Plan
    index: ScanIndex
    walk: WalkProblems = field(default_factory=WalkProblems)
    splits: dict[str, SplitTotals] = field(default_factory=dict)
    tfrecords: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what was read from record files (datasets, columns)

    def close(self) -> None:
        self.index.close()


# -- worker pool ---------------------------------------------------------------------------
def available_cpus() -> int:
    """CPUs this process may run on: more worker processes than that only add memory and forks."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class WorkerPool:
    """A process pool (or in-process for one worker) fed with a bounded window of batches."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._pool = None
        if self.workers > 1:
            methods = multiprocessing.get_all_start_methods()
            # fork starts workers in milliseconds with Pillow/numpy already imported.
            context = multiprocessing.get_context("fork" if "fork" in methods else None)
            self._pool = context.Pool(self.workers)

    def map_batches(self, function: Callable, batches: Iterable[list]) -> Iterator[tuple[list, Any]]:
        """Yield (batch, function(batch)); at most workers × IN_FLIGHT_PER_WORKER pending."""
        if self._pool is None:
            for batch in batches:
                yield batch, function(batch)
            return
        pending: deque = deque()
        limit = self.workers * IN_FLIGHT_PER_WORKER
        for batch in batches:
            pending.append((batch, self._pool.apply_async(function, (batch,))))
            if len(pending) >= limit:
                done, result = pending.popleft()
                yield done, result.get()
        while pending:
            done, result = pending.popleft()
            yield done, result.get()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            if exc[0] is None:
                self._pool.close()
            else:
                self._pool.terminate()
            self._pool.join()


def _batched(items: Iterable, size: int) -> Iterator[list]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def _probe_paths(tasks: list[FileTask]) -> list[list]:
    return [record.to_json() for record in probe_batch([task.path for task in tasks])]


def _scan_tfrecord_paths(items: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    return [scan_tfrecord(path) for path, _, _ in items]


# -- the scan ------------------------------------------------------------------------------
def make_pool(options: ScanOptions, workers: int) -> Any:
    if options.engine == "ray":
        from nndoctor.commands.data.ray_engine import RayPool

        return RayPool(workers if options.workers else None, options.address)
    return WorkerPool(workers)


def scan(plan: Plan, options: ScanOptions) -> ScanResult:
    started = time.perf_counter()
    result = ScanResult(plan=plan, index=ScanIndex())
    result.walk.unreadable.extend(plan.skipped)
    # Object-store files have no stable (size, mtime) to key the cache on.
    remote = any(split.remote is not None for split in plan.splits)
    cache = ScanCache() if options.use_cache and not remote else None
    counters: Counter[str] = Counter()
    workers = min(options.workers, available_cpus()) if options.workers else available_cpus()
    try:
        pool_started = time.perf_counter()
        pool = make_pool(options, workers)
        pool_seconds = time.perf_counter() - pool_started
        with pool, ScanProgress(options.progress) as progress:
            if progress.enabled:
                count_files_in_background(plan, progress)
            _scan_images(plan, result, pool, cache, progress, counters)
            _scan_tfrecords(plan, result, pool, cache, progress, counters)
            _scan_records(plan, result, pool, options.read, progress, counters)
            workers = pool.workers
    finally:
        if cache is not None:
            cache.close()
    result.index.finish()
    seconds = time.perf_counter() - started
    files = counters["files"] + counters["tfrecord_files"] + counters["records"]
    result.stats = {
        "files_scanned": counters["files"],
        "images_decoded": counters["images"],
        "tfrecord_files": counters["tfrecord_files"],
        "tfrecord_records": sum(s["records"] for _, s in result.tfrecords),
        "record_files": len(plan.records),
        "records": counters["records"],
        "seconds": round(seconds, 3),
        "files_per_second": round(files / seconds, 1) if seconds > 0 else None,
        # Starting the workers (a local Ray instance takes seconds) is not the scan's speed.
        "pool_start_seconds": round(pool_seconds, 3),
        "files_per_second_after_start": round(files / (seconds - pool_seconds), 1) if seconds > pool_seconds else None,
        "cache_hits": counters["cache_hits"],
        "files_read": counters["files_read"],
        "workers": workers,
        "engine": options.engine,
        "cache": None if cache is None else (cache.error or str(cache.path)),
        "splits": {name: {"files": t.files, "images": t.images} for name, t in result.splits.items()},
    }
    if plan.records:
        result.stats["sources"] = result.notes
    return result


def count_files_in_background(plan: Plan, progress: ScanProgress) -> threading.Thread:
    """List the files on a thread (directory entries only) and give the progress bar its total."""
    def count() -> None:
        try:
            total = sum(1 for split in plan.splits for _ in iter_files(split, WalkProblems()))
            if not plan.records:  # record files advance by units, whose number is not known yet
                progress.set_total(total + len(plan.tfrecords))
        except Exception:  # noqa: BLE001 - the bar simply stays a counter
            pass

    thread = threading.Thread(target=count, name="nndoctor-data-listing", daemon=True)
    thread.start()
    return thread


def _with_cache(
    items: Iterable[tuple[Any, str, int, int]], cache: ScanCache | None, version: str,
    counters: Counter, batch_size: int, valid: Callable[[Any], bool],
) -> Iterator[tuple[list, dict[str, Any]]]:
    """Batches of (item, path, size, mtime) with the cached results found for them."""
    for batch in _batched(items, batch_size):
        found = cache.lookup(((p, s, m) for _, p, s, m in batch), version, valid) if cache else {}
        counters["cache_hits"] += len(found)
        yield batch, found


def _scan_images(
    plan: Plan, result: ScanResult, pool: Any, cache: ScanCache | None,
    progress: ScanProgress, counters: Counter,
) -> None:
    version = f"probe{PROBE_VERSION}"
    tasks = ((t, t.path, t.size, t.mtime_ns) for split in plan.splits for t in iter_files(split, result.walk))
    for split in plan.splits:
        result.splits[split.name] = SplitTotals()
    progress.stage("scanning images")

    def uncached() -> Iterator[list[FileTask]]:
        # Cached results are ingested as they are met; only misses go to the workers.
        for batch, found in _with_cache(tasks, cache, version, counters, 256, FileRecord.valid_json):
            misses = []
            for task, path, _, _ in batch:
                if path in found:
                    _ingest(result, task, FileRecord.from_json(found[path]), counters)
                    progress.advance()
                else:
                    misses.append(task)
            yield from _batched(misses, IMAGE_BATCH)

    for batch, records in pool.map_batches(_probe_paths, uncached()):
        counters["files_read"] += len(batch)
        if cache is not None:
            cache.store(((t.path, t.size, t.mtime_ns, r) for t, r in zip(batch, records)), version)
        for task, values in zip(batch, records):
            _ingest(result, task, FileRecord.from_json(values), counters)
        progress.advance(len(batch))


def _ingest(result: ScanResult, task: FileTask, record: FileRecord, counters: Counter) -> None:
    counters["files"] += 1
    totals = result.splits[task.split]
    totals.files += 1
    path = display(task.path)
    for code, detail in per_file_issues(task.path, record):
        result.index.add_issue(code, task.split, path, detail)
    if record.kind != "image":
        return
    counters["images"] += 1
    totals.images += 1
    totals.class_images[task.cls] += 1
    if record.moments:
        totals.moments = [a + b for a, b in zip(totals.moments, record.moments)]
    result.index.add_image(
        task.split, task.cls, path, record.mode, record.width, record.height,
        record.digest, record.phash,
    )


def _scan_records(
    plan: Plan, result: ScanResult, pool: Any, read: ReadOptions, progress: ScanProgress, counters: Counter,
) -> None:
    """HDF5, LMDB, WebDataset, Parquet and NumPy sources: units to the workers, records to the index."""
    if not plan.records:
        return
    progress.stage("reading records")
    units: list[Unit] = []
    paired, used = numpy_arrays.plan_pairs([(s.path, s.split) for s in plan.records if s.kind == "npy"], read)
    for info in paired:  # X_train.npy with y_train.npy …
        units += info.units
        result.notes += info.notes
    for source in plan.records:
        if source.path in used:
            continue
        info = plan_source(source.kind, source.path, source.split, read)
        units += info.units
        result.notes += info.notes
    known = {split.name for split in plan.splits}
    for unit in units:
        if unit.split not in known:
            known.add(unit.split)
            plan.splits.append(Split(name=unit.split, root=unit.path, records=True))
            result.splits[unit.split] = SplitTotals()
    # One unit per task: a unit is already a few hundred records or a whole shard.
    for _, rows_per_unit in pool.map_batches(probe_units, ([unit] for unit in units)):
        for rows in rows_per_unit:
            for location, split, label, ext, values in rows:
                _ingest_record(result, split, label, location, ext, FileRecord.from_json(values), counters)
        progress.advance(len(rows_per_unit))
    for split in plan.splits:
        if split.records:
            labels = result.splits[split.name].labels
            split.classes = sorted((label for label in labels if label), key=_label_order)
            split.flat = not split.classes


def _label_order(label: str) -> tuple[bool, int, str]:
    """Numeric labels in numeric order (2 before 10), then names alphabetically."""
    numeric = label.lstrip("-").isdigit()
    return not numeric, int(label) if numeric else 0, label


def _ingest_record(
    result: ScanResult, split: str, label: str | None, location: str, ext: str | None,
    record: FileRecord, counters: Counter,
) -> None:
    counters["records"] += 1
    totals = result.splits[split]
    totals.files += 1
    cls = label or ""
    totals.labels[cls] += 1
    shown = display(location)
    for code, detail in record_issues(record, ext):
        result.index.add_issue(code, split, shown, detail)
    if record.kind != "image":
        return
    counters["images"] += 1
    totals.images += 1
    totals.class_images[cls] += 1
    if record.moments:
        totals.moments = [a + b for a, b in zip(totals.moments, record.moments)]
    result.index.add_image(split, cls, shown, record.mode, record.width, record.height, record.digest, record.phash)


def _scan_tfrecords(
    plan: Plan, result: ScanResult, pool: Any, cache: ScanCache | None,
    progress: ScanProgress, counters: Counter,
) -> None:
    if not plan.tfrecords:
        return
    version = f"tfrecord{TFRECORD_VERSION}"
    progress.stage("reading TFRecords")
    items = []
    todo = []
    for path in plan.tfrecords:
        if is_url(path):
            todo.append((path, 0, 0))  # objects have no mtime to key the cache on
            continue
        try:
            st = os.stat(path)
            items.append(((path, st.st_size, st.st_mtime_ns), path, st.st_size, st.st_mtime_ns))
        except OSError as error:
            result.tfrecords.append((path, _unopenable(error)))
    for batch, found in _with_cache(items, cache, version, counters, 256, valid_summary):
        for item, path, _, _ in batch:
            if path in found:
                result.tfrecords.append((path, found[path]))
                progress.advance()
            else:
                todo.append(item)
    # One file per task: TFRecord shards are large, so the pool balances them file by file.
    for batch, summaries in pool.map_batches(_scan_tfrecord_paths, ([item] for item in todo)):
        for (path, size, mtime), summary in zip(batch, summaries):
            result.tfrecords.append((path, summary))
            if cache is not None and not is_url(path):
                cache.store([(path, size, mtime, summary)], version)
        progress.advance(len(batch))
    counters["tfrecord_files"] = len(result.tfrecords)
    result.tfrecords.sort(key=lambda item: item[0])


def _unopenable(error: OSError) -> dict[str, Any]:
    return {
        "records": 0, "compression": "none", "unparseable": [], "signatures": {}, "lengths": {},
        "bad_images": [], "images": 0,
        "corrupt": [[None, 0, f"cannot open: {error.strerror or error}"]],
    }
