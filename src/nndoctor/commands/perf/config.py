"""The settings of one ``nndoctor perf`` run (both frameworks): the window and the ``--try`` budget."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PerfConfig:
    warmup: int = 5
    steps: int = 20
    tries: tuple[str, ...] = ()
    # Tensors on these device types count as host-device syncs when read back on the host.
    # Tests use {"cpu"} as a stand-in for CUDA on machines without a GPU.
    sync_device_types: frozenset[str] = frozenset({"cuda"})
    try_seconds: float = 2.0  # time box of one --try loader configuration
    try_repeats: int = 3  # interleaved re-runs of the script per step change (and of the baseline)
    try_all: bool = False  # --try all: the other framework's changes are left out silently
    # --budget: seconds for the whole perf run (the measured window included), counted from
    # ``started`` (time.monotonic(); None: from the start of the run).
    budget: float = 300.0
    started: float | None = None

    @property
    def last_step(self) -> int:
        return self.warmup + self.steps
