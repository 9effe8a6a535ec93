"""Cost of the crash-path fetch wrapper on successful epochs (CPU, num_workers=0).

Run: python tests/explain/bench_fetch_overhead.py   (not collected by pytest)
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from nndoctor.commands.explain import instrument
from nndoctor.instrument.patches import Patcher


class _Installation:
    """Only the fetch patch, without the rest of the engine's instrumentation."""

    def __init__(self) -> None:
        self.patcher = Patcher()


def main() -> None:
    data = TensorDataset(torch.randn(20000, 8), torch.randint(0, 10, (20000,)))
    loader = DataLoader(data, batch_size=32)

    def epoch() -> float:
        started = time.perf_counter()
        for _ in loader:
            pass
        return time.perf_counter() - started

    # Alternate plain and patched epochs (the machine is shared: drifts hit both alike) and
    # compare the fastest of each, the least disturbed measurement.
    epoch()
    plain, patched = [], []
    for _ in range(15):
        plain.append(epoch())
        installation = _Installation()
        instrument.install(installation)
        patched.append(epoch())
        installation.patcher.undo_all()
    best_plain, best_patched = min(plain), min(patched)
    print(f"{len(loader)} batches/epoch, best of 15: plain {best_plain * 1e3:.1f} ms, patched "
          f"{best_patched * 1e3:.1f} ms, difference {(best_patched - best_plain) / len(loader) * 1e6:+.2f} µs/batch "
          f"({(best_patched / best_plain - 1) * 100:+.1f}%); medians {statistics.median(plain) * 1e3:.1f} / "
          f"{statistics.median(patched) * 1e3:.1f} ms")

if __name__ == "__main__":
    main()
