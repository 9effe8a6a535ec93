"""``--engine ray``: the per-file and per-shard work on Ray Data, the reductions in the driver.

``RayPool`` has the interface of the local ``WorkerPool`` (``map_batches``), so the scan, the
cache, the index and the analysis are the same code for both engines and give the same report.
Batches go to Ray in windows (one Ray Data dataset per window, cut into a few blocks per
worker: one Ray task per block, each running its batches in turn); each task returns the compact per-file rows (sizes, hashes,
channel moments), which the driver folds into the scan index: sums and counters are
associative, and duplicates are found by the index's GROUP BY, so nothing is shuffled.
Paths must be readable from the workers: a shared file system or object-store URLs.
"""

from __future__ import annotations

import logging
import pickle
import signal
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from nndoctor.util.errors import UsageError

WINDOW = 512  # batches per Ray dataset: amortises its start-up, bounds the driver's memory
BLOCKS_PER_WORKER = 4  # Ray tasks per worker and window: few enough to amortise a task's cost,
# enough that a slow task does not leave the other workers idle for long


def _ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401 - the Data library is the ray[data] extra
    except ImportError:
        raise UsageError("--engine ray needs Ray Data: pip install 'nndoctor[ray]'") from None
    return ray


class _Apply:
    """The task body: unpickle a batch, run the probe, pickle its rows (Arrow never sees them)."""

    def __init__(self, function: Callable) -> None:
        self.function = function

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        batch = pickle.loads(row["batch"])
        return {"i": row["i"], "result": pickle.dumps(self.function(batch))}


class RayPool:
    def __init__(self, workers: int | None, address: str | None) -> None:
        ray = _ray()
        self._owned = False
        # ray.init replaces the process's SIGTERM handler with one calling sys.exit(15), which
        # forked children would then inherit; the handler the caller had comes back on exit.
        self._sigterm_before = signal.getsignal(signal.SIGTERM)
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
                else:
                    ray.init(num_cpus=workers, include_dashboard=False, logging_level=logging.ERROR,
                             log_to_driver=False)
            except Exception as error:  # noqa: BLE001 - connection errors come in many types
                raise UsageError(f"cannot start or reach Ray{' at ' + address if address else ''}: {error}") from None
            self._owned = True
        # Ray Data logs each dataset's execution at INFO; the report is the output here.
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        self.workers = int(ray.cluster_resources().get("CPU", 1))

    def map_batches(self, function: Callable, batches: Iterable[list]) -> Iterator[tuple[list, Any]]:
        ray = _ray()
        iterator = iter(batches)
        while window := list(islice(iterator, WINDOW)):
            items = [{"i": i, "batch": pickle.dumps(batch)} for i, batch in enumerate(window)]
            blocks = min(len(items), self.workers * BLOCKS_PER_WORKER)
            dataset = ray.data.from_items(items, override_num_blocks=blocks).map(_Apply(function))
            results: dict[int, Any] = {}
            for row in dataset.iter_rows():
                results[row["i"]] = pickle.loads(row["result"])
            for i, batch in enumerate(window):
                yield batch, results[i]

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._owned:
            _ray().shutdown()
            if self._sigterm_before is not None:
                signal.signal(signal.SIGTERM, self._sigterm_before)
