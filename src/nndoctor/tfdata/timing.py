"""How long each training step waits for its next ``tf.data`` element.

For every fetch of an iterator the instrumentation records when the call started and how long
it took. The step period is the time from one fetch to the next (waiting + everything the
training loop did with the element); the input-bound share is total waiting over total
period. The first fetches of a dataset are left out: they start the pipeline's threads and
include tracing the user's compiled step, neither of which repeats.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

# Fetches of a dataset that are not measured (pipeline start-up, the step's first trace).
SKIPPED_FETCHES = 2
# Periods kept per dataset: enough for a stable share, bounded memory.
MAX_PERIODS = 2000


@dataclass
class FetchClock:
    """Fetch timings of one dataset, across all its iterators (one per epoch)."""

    fetches: int = 0
    epochs: int = 0  # iterators over this dataset that gave more than one batch (Keras's
    # symbolic build takes a single batch from an iterator of its own)
    waits: list[float] = field(default_factory=list)  # seconds waited, one per measured period
    periods: list[float] = field(default_factory=list)  # seconds from a fetch to the next one
    _last_start: float | None = None
    _last_wait: float | None = None
    _iterator_fetches: int = 0

    def new_iterator(self) -> None:
        self._iterator_fetches = 0
        # The gap between epochs (validation, callbacks) is no training step.
        self._last_start = self._last_wait = None

    def fetched(self, start: float, end: float) -> None:
        self.fetches += 1
        self._iterator_fetches += 1
        if self._iterator_fetches == 2:
            self.epochs += 1
        if self._last_start is not None and self.fetches > SKIPPED_FETCHES + 1 \
                and len(self.periods) < MAX_PERIODS:
            self.periods.append(start - self._last_start)
            self.waits.append(self._last_wait or 0.0)
        self._last_start, self._last_wait = start, end - start

    def stopped(self) -> None:
        """The iterator ran out: its last fetch ends no step."""
        self._last_start = self._last_wait = None

    @property
    def measured(self) -> int:
        return len(self.periods)

    @property
    def wait_seconds(self) -> float:
        return sum(self.waits)

    @property
    def step_seconds(self) -> float:
        return sum(self.periods)

    @property
    def wait_share(self) -> float:
        total = self.step_seconds
        return self.wait_seconds / total if total > 0 else 0.0

    @property
    def mean_wait_ms(self) -> float:
        return 1000 * self.wait_seconds / self.measured if self.measured else 0.0

    @property
    def median_wait_ms(self) -> float:
        return 1000 * statistics.median(self.waits) if self.waits else 0.0

    @property
    def mean_step_ms(self) -> float:
        return 1000 * self.step_seconds / self.measured if self.measured else 0.0
