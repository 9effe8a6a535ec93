"""How long each training step waits for its next ``tf.data`` element.

For every fetch of an iterator the instrumentation records when the call started and how long
it took. The step period is the time from one fetch to the next (waiting + everything the
training loop did with the element); the input-bound share is total waiting over total
period. The first fetches of a dataset are left out: they start the pipeline's threads and
include tracing the user's compiled step, neither of which repeats.

Keras on the TensorFlow backend fetches inside its compiled train function: there the graph
itself takes the times (``GraphFetchClock``), returned as an extra output of nndoctor's own
outer function (or, where Keras's train function is not as expected, written to nndoctor's
variables): every fetch of a train function's first
``ALWAYS_TIMED`` calls, then windows of ``WINDOW_FETCHES`` consecutive fetches every
``WINDOW_EVERY`` (at most ``GRAPH_FETCHES`` fetches per run).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

# Fetches of a dataset that are not measured (pipeline start-up, the step's first trace).
SKIPPED_FETCHES = 2
# Periods kept per dataset: enough for a stable share, bounded memory.
MAX_PERIODS = 2000
# Fetches of compiled Keras train functions timed per run (the rows of the graph's variable, or
# the times returned by nndoctor's outer functions kept).
GRAPH_FETCHES = 4096
# A compiled train function's first ALWAYS_TIMED calls are timed, then WINDOW_FETCHES consecutive
# calls every WINDOW_EVERY. The timed ops cost ~0.1-0.3 ms a step on a 2-core CPU (measured in
# fit), a tenth of a small model's step. Through nndoctor's own outer function the calls in
# between run the same function, their times dropped (bounded memory, spread-out samples); the
# fallback through Keras's own function (variable writes) times every call. K106's share is
# still taken on consecutive steps.
ALWAYS_TIMED = 1024
WINDOW_FETCHES = 32
WINDOW_EVERY = 512


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

    def resumed(self) -> None:
        """The same iterator, timed again after untimed fetches: no period spans the gap."""
        self._last_start = self._last_wait = None

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


class GraphFetchClock:
    """Fetch times taken by a compiled function itself (TensorFlow graph, no Python per step).

    ``timed(get_next)``, called while the function is traced, puts a ``tf.timestamp`` before
    the fetch and one after the element is produced (control dependencies only: the element
    goes to the step unchanged) and hands both to the traced function as a tensor to return
    (``stamps``: no variable written) or, without ``stamps``, writes both into row ``count`` of nndoctor's variable,
    then counts the fetch. A fetch that fails (the end of the data) writes nothing. Rows past
    ``GRAPH_FETCHES`` go to one spare row that is never read. While the ``wants_labels``
    variable is true (set per iterator: its dataset is a K107 suspect and fewer than 16
    batches were read), a ``tf.numpy_function`` hands the batch's labels to Python, which
    answers whether it wants more; otherwise the step pays one variable read and a branch.
    """

    def __init__(self, tf: Any) -> None:
        self._tf = tf
        with tf.init_scope():  # nndoctor's variables live outside the user's graph
            self.times = tf.Variable(tf.zeros((GRAPH_FETCHES + 1, 2), tf.float64), trainable=False,
                                     name="nndoctor_fetch_times")
            self.fetches = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="nndoctor_fetches")
            self.wants_labels = tf.Variable(False, trainable=False, name="nndoctor_wants_labels")

    def timed(self, get_next: Any, label_tensor: Any = None, on_labels: Any = None,
              stamps: list[Any] | None = None) -> Any:
        """``stamps``: a list of the function being traced, which returns the two times as outputs
        (nndoctor's own outer function, see ``instrument._own_outer``): they are appended to it and
        nothing is written to the variables."""
        tf = self._tf
        began = tf.timestamp()
        with tf.control_dependencies([began]):
            element = get_next()
        with tf.control_dependencies(tf.nest.flatten(element, expand_composites=True)):
            ended = tf.timestamp()
        if stamps is not None:
            stamps.append(tf.stack([began, ended]))
        else:
            row = tf.minimum(self.fetches.read_value(), GRAPH_FETCHES)
            self.times.scatter_nd_update(tf.reshape(row, (1, 1)), tf.reshape(tf.stack([began, ended]), (1, 2)))
            self.fetches.assign_add(1)
        labels = label_tensor(element) if label_tensor is not None else None
        if on_labels is not None and isinstance(labels, tf.Tensor):
            def read() -> Any:
                more = tf.numpy_function(on_labels, [labels], tf.bool, stateful=True)
                self.wants_labels.assign(tf.reshape(more, []))
                return tf.constant(0)

            tf.cond(self.wants_labels.read_value(), read, lambda: tf.constant(0))
        return element

    def want_labels(self, wanted: bool) -> None:
        self.wants_labels.assign(wanted)

    def count(self) -> int:
        return int(self.fetches.numpy())

    def read(self, start: int) -> list[tuple[float, float]]:
        """(start, end) of the fetches from index ``start`` on, within the timed window."""
        end = min(self.count(), GRAPH_FETCHES)
        if start >= end:
            return []
        return [(float(a), float(b)) for a, b in self.times.numpy()[start:end]]
