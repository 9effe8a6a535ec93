"""Zero-code-change instrumentation of ``tf.data`` (K106, K107, and D105 for a pipeline with no shuffle).

Nothing here imports TensorFlow: the patches are applied right after the user's script
imports it (``hooks.when_imported``) and undone at the end of the run.

What is patched, and why:

* the ``tf.data.Dataset`` methods that add a stage (``map``, ``shuffle``, ``batch``,
  ``prefetch``, ``cache``, …) record the user's line for the dataset they return (weakly),
  so advice points at the ``map`` that lacks ``num_parallel_calls``;
* ``Dataset.__iter__`` ties each new iterator to its dataset (one iterator per epoch);
* ``OwnedIterator.__next__`` times each eager fetch — how long the loop waited for the
  element — and reads the labels of a dataset's first batches when the pipeline shuffles
  with a small buffer (K107) or does not shuffle at all (D105, with the optimizer steps done
  at each fetch: only batches followed by a step are training batches). Elements are
  returned as produced; nothing is drawn from any random stream;
* ``OwnedIterator.get_next`` (graph mode, only while a wrapped Keras train function is
  traced): see the last point;
* Keras on the TensorFlow backend fetches its batches *inside* the compiled train function,
  where no Python call can be timed. For ``steps_per_execution == 1``, nndoctor runs its own
  ``tf.function`` of Keras's ``multi_step_on_iterator`` in place of Keras's (the compiled step
  inside is Keras's, traced and compiled once), with ``OwnedIterator.get_next`` wrapped in two
  ``tf.timestamp`` ops returned as an extra output that Python strips off before Keras sees
  the result (``GraphFetchClock``): the fetch stays where Keras put it, the batch and the
  compiled step are untouched, and Python reads the times once per iterator (epoch), not per
  step (where Keras's train function is not shaped as expected, Keras's own is traced with the
  times written into nndoctor's variables instead); a K107 suspect's first label batches reach Python
  through a ``tf.numpy_function`` behind a branch on nndoctor's variable, built into the graph
  only when the dataset traced with is a suspect (a train function traced on a well-shuffled
  dataset and reused, untraced, on a suspect one does not read its labels). Fetching eagerly
  instead, as nndoctor did before, made every step pay an eager ``next()`` and Keras's
  per-batch Python path. A model compiled with ``run_eagerly=True`` has no graph: its batch is
  fetched eagerly (timed) and handed to Keras's own per-batch path.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
import weakref
from typing import TYPE_CHECKING, Any

from nndoctor.core.findings import Location
from nndoctor.core.registry import framework_checks
from nndoctor.instrument.features import Feature, install_features
from nndoctor.instrument.location import user_location
from nndoctor.instrument.wrapping import mark_wrapper
from nndoctor.tfdata.events import DatasetIterated
from nndoctor.tfdata.hooks import when_imported
from nndoctor.tfdata.labels import batch_summary
from nndoctor.tfdata.pipeline import Pipeline, read_pipeline
from nndoctor.tfdata.timing import (
    ALWAYS_TIMED,
    GRAPH_FETCHES,
    WINDOW_EVERY,
    WINDOW_FETCHES,
    FetchClock,
    GraphFetchClock,
)

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol

STAGE_METHODS = ("map", "shuffle", "batch", "padded_batch", "prefetch", "cache", "interleave", "repeat",
                 "filter", "take", "unbatch")
# K107 reads the labels of this many first batches of a dataset.
LABEL_BATCHES = 16
# A shuffle buffer this many times smaller than the dataset counts as small.
SMALL_BUFFER_RATIO = 10
TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"


class DatasetRecord:
    """What was learned about one dataset (the object the user iterates)."""

    def __init__(self, dataset: Any, pipeline: Pipeline, location: Location | None) -> None:
        self.ref = weakref.ref(dataset)
        self.pipeline = pipeline
        self.location = location  # the line that iterated it first (fit, a for loop)
        self.clock = FetchClock()
        self.label_batches: list[tuple[int, float, int]] = []
        self.label_steps: list[int] = []  # the optimizer steps done when each of them was fetched
        self.wants_labels = small_shuffle(pipeline) is not None or not pipeline.has("shuffle")
        self.element_bytes: int | None = None


def small_shuffle(pipeline: Pipeline) -> tuple[int, int] | None:
    """(buffer, elements) when the pipeline shuffles with a buffer far below its size."""
    shuffle = pipeline.first("shuffle")
    if shuffle is None or shuffle.buffer_size is None or shuffle.cardinality is None:
        return None
    if shuffle.buffer_size * SMALL_BUFFER_RATIO <= shuffle.cardinality:
        return shuffle.buffer_size, shuffle.cardinality
    return None


class TfDataObserver:
    def __init__(self, installation: InstallationProtocol) -> None:
        self.installation = installation
        self.session = installation.session
        self.enabled = True
        self.locations: weakref.WeakKeyDictionary[Any, Location] = weakref.WeakKeyDictionary()
        self.records: dict[int, DatasetRecord] = {}  # id(dataset) -> record (dataset kept weakly)
        self.iterators: weakref.WeakKeyDictionary[Any, DatasetRecord] = weakref.WeakKeyDictionary()
        self._tf: Any = None
        # Keras's compiled train functions (TensorFlow backend): fetch times written by the graph.
        self.graph_clock: GraphFetchClock | None = None
        self.timing_trace = False  # True while nndoctor's train-function wrapper runs (traces time get_next)
        # While nndoctor's own outer function (``_own_outer``) is traced: the list its timed
        # get_next appends its two times to (returned as outputs, no variable written).
        self.trace_stamps: list[Any] | None = None
        # The iterator the compiled train function is fetching from, timed: (weak iterator, record,
        # first fetch index, whether an earlier window of the same iterator was timed, the times
        # returned by nndoctor's own outer function: eager tensors, read when the span closes).
        self._segment: tuple[Any, DatasetRecord | None, int, bool, list[Any]] | None = None
        self._stamps_kept = 0  # times returned by outer functions kept in this run (at most GRAPH_FETCHES)
        self._last_timed: Any = None  # weak reference to the iterator of the last timed window

    # -- patching ----------------------------------------------------------------------
    def patch_tensorflow(self, tf: Any) -> None:
        if not self.session.wants(DatasetIterated.kind) or not hasattr(tf, "data"):
            return
        from tensorflow.python.data.ops import dataset_ops, iterator_ops

        self._tf = tf
        patcher = self.installation.patcher
        for name in STAGE_METHODS:
            if name in dataset_ops.DatasetV2.__dict__:
                self._patch_stage(dataset_ops.DatasetV2, name)
        original_iter = patcher.patch(dataset_ops.DatasetV2, "__iter__", None)

        def __iter__(dataset):
            iterator = original_iter(dataset)
            if self.enabled and os.getpid() == self.session.pid and tf.executing_eagerly():
                self._guard(lambda: self._new_iterator(dataset, iterator))
            return iterator

        patcher.patch(dataset_ops.DatasetV2, "__iter__", __iter__)
        original_next = patcher.patch(iterator_ops.OwnedIterator, "__next__", None)
        clock = time.perf_counter

        def __next__(iterator):
            record = self.iterators.get(iterator) if self.enabled else None
            if record is None or not tf.executing_eagerly():
                return original_next(iterator)
            start = clock()
            try:
                element = original_next(iterator)
            except StopIteration:
                record.clock.stopped()
                raise
            record.clock.fetched(start, clock())
            if record.wants_labels and len(record.label_batches) < LABEL_BATCHES:
                self._guard(lambda: self._read_labels(record, element))
            return element

        patcher.patch(iterator_ops.OwnedIterator, "__next__", __next__)
        original_get_next = patcher.patch(iterator_ops.OwnedIterator, "get_next", None)

        def get_next(iterator):
            # Only while a Keras train function wrapped below is traced: the graph times its own fetch.
            clock = self.graph_clock  # created eagerly by that wrapper
            stamps = self.trace_stamps
            if clock is not None and (self.timing_trace or stamps is not None) and self.enabled \
                    and not tf.executing_eagerly():
                # The labels branch only where the dataset being traced is a K107 suspect: a
                # graph with it costs a cond and a numpy_function op to trace.
                wanted = self._segment is not None and _wants_labels(self._segment[1])
                return clock.timed(lambda: original_get_next(iterator), label_tensor,
                                   self.graph_labels if wanted else None, stamps)
            return original_get_next(iterator)

        patcher.patch(iterator_ops.OwnedIterator, "get_next", get_next)
        patcher.on_undo(self._conclude)
        when_imported(TRAINER_MODULE, lambda module: self._guard(lambda: self.patch_keras_trainer(module)),
                      patcher)

    def patch_keras_trainer(self, module: Any) -> None:
        from tensorflow.python.data.ops import iterator_ops

        trainer = getattr(module, "TensorFlowTrainer", None)
        if trainer is None:
            return
        original = self.installation.patcher.patch(trainer, "make_train_function", None)
        observer = self

        def make_train_function(model, force=False):
            result = original(model, force)
            function = getattr(model, "train_function", None)
            if function is not None and not getattr(function, "_nndoctor_timed_fetch", False):
                model.train_function = _timed_fetch(function, model, observer, iterator_ops.OwnedIterator)
                return model.train_function if result is function else result
            return result

        mark_wrapper(make_train_function, original)
        self.installation.patcher.patch(trainer, "make_train_function", make_train_function)

    def _patch_stage(self, owner: Any, name: str) -> None:
        original = self.installation.patcher.patch(owner, name, None)
        locations = self.locations

        def stage(dataset, *args, **kwargs):
            result = original(dataset, *args, **kwargs)
            if self.enabled:
                try:
                    location = user_location(sys._getframe(1))
                    if location is not None:
                        locations[result] = location
                        locations.setdefault(dataset, location)  # the source's line, as far as known
                except Exception as error:  # noqa: BLE001 - observer rule
                    self.session.internal_error("tf.data instrumentation", error)
            return result

        mark_wrapper(stage, original)
        self.installation.patcher.patch(owner, name, stage)

    def _disable(self) -> None:
        self.enabled = False

    # -- observing ---------------------------------------------------------------------
    def _new_iterator(self, dataset: Any, iterator: Any) -> None:
        record = self.records.get(id(dataset))
        if record is not None and record.ref() is not dataset:
            record = None  # the id of a collected dataset, reused
        if record is None:
            record = DatasetRecord(dataset, read_pipeline(dataset, self.locations),
                                   user_location(sys._getframe(2)))
            self.records[id(dataset)] = record
        record.clock.new_iterator()
        self.iterators[iterator] = record

    def graph_fetch(self, iterator: Any, skippable: bool) -> bool:
        """A compiled train function is about to fetch from ``iterator``: is this fetch timed?

        ``skippable``: the train function can leave this fetch untimed (outside its windows, see
        ``timing.ALWAYS_TIMED``); a dataset whose labels are still wanted (K107, D105) is read
        anyway. A new iterator, or the end of a window, closes the previous span of graph-timed
        fetches (one variable read per span, not per step)."""
        record = self.iterators.get(iterator)
        timed = not skippable or _wants_labels(record)
        segment = self._segment
        if timed and segment is not None and segment[0]() is iterator:
            return True
        self._close_segment()
        if not timed:
            return False
        clock = self.graph_clock
        continued = self._last_timed is not None and self._last_timed() is iterator
        self._last_timed = weakref.ref(iterator)
        self._segment = (weakref.ref(iterator), record, clock.count() if clock is not None else 0, continued, [])
        if clock is not None:
            clock.want_labels(_wants_labels(record))
        return True

    def _close_segment(self) -> None:
        """Hand the fetch times the graph wrote for the current iterator to its dataset's clock."""
        segment, self._segment = self._segment, None
        if segment is None or self.graph_clock is None:
            return
        _, record, start, continued, stamps = segment
        if record is None:
            return
        if continued:
            record.clock.resumed()
        else:
            record.clock.new_iterator()
        for began, ended in self.graph_clock.read(start):
            record.clock.fetched(began, ended)
        for times in stamps:  # eager tensors, computed long ago: no wait
            began, ended = times.numpy()
            record.clock.fetched(float(began), float(ended))
        record.clock.stopped()

    def graph_stamps(self, times: Any) -> None:
        """The (start, end) of a fetch, returned by nndoctor's own outer function (an eager tensor,
        not read here: reading it would wait for the step)."""
        segment = self._segment
        if segment is not None and self._stamps_kept < GRAPH_FETCHES:
            segment[4].append(times)
            self._stamps_kept += 1

    def graph_labels(self, array: Any) -> Any:
        """Called by the compiled train function (``tf.numpy_function``) with the labels of a batch
        while the current iterator's dataset wants them (K107, D105); returns whether it still does."""
        import numpy as np

        segment = self._segment
        record = segment[1] if segment is not None else None
        try:
            if record is not None and record.wants_labels and len(record.label_batches) < LABEL_BATCHES:
                labels = labels_of(array)
                if labels is None:
                    record.wants_labels = False
                else:
                    record.label_batches.append(batch_summary(labels))
                    record.label_steps.append(self.session.step)
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("tf.data instrumentation", error)
            record = None
        return np.bool_(_wants_labels(record))

    def _read_labels(self, record: DatasetRecord, element: Any) -> None:
        labels = label_values(element)
        if labels is None:
            record.wants_labels = False  # no (x, y) integer labels: nothing to read
            return
        record.label_batches.append(batch_summary(labels))
        record.label_steps.append(self.session.step)

    def _conclude(self) -> None:
        self._guard(self._close_segment)
        if self.graph_clock is not None:  # a model trained again after the run calls no Python of ours
            self._guard(lambda: self.graph_clock.want_labels(False))
        self.enabled = False
        session = self.session
        for record in self.records.values():
            session.emit(DatasetIterated(step=session.step, sampled=True, record=record))

    def _guard(self, action: Any) -> None:
        try:
            action()
        except Exception as error:  # noqa: BLE001 - observer rule
            self.session.internal_error("tf.data instrumentation", error)


def _wants_labels(record: DatasetRecord | None) -> bool:
    return record is not None and record.wants_labels and len(record.label_batches) < LABEL_BATCHES


def label_tensor(element: Any) -> Any:
    """The label part of an ``(x, y)`` / ``(x, y, w)`` element or a dict's ``label`` key (None: none)."""
    candidate = None
    if isinstance(element, (tuple, list)) and len(element) >= 2:
        candidate = element[1]
    elif isinstance(element, dict):
        candidate = next((element[k] for k in ("label", "labels", "target", "y") if k in element), None)
    return candidate


def label_values(element: Any) -> list[int] | None:
    """The integer class labels of an ``(x, y)`` / ``(x, y, w)`` batch or a ``label`` key."""
    candidate = label_tensor(element)
    if candidate is None or not hasattr(candidate, "numpy"):
        return None
    return labels_of(candidate.numpy())


def labels_of(array: Any) -> list[int] | None:
    """Integer class labels from a batch's label array: a 1-D integer array, an ``(N, 1)`` one,
    or one-hot rows (their argmax)."""
    import numpy as np

    values = np.asarray(array)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim == 2 and values.shape[1] >= 2 and np.all((values == 0) | (values == 1)) \
            and np.all(values.sum(axis=1) == 1):
        values = values.argmax(axis=1)
    if values.ndim != 1 or values.size == 0 or not np.issubdtype(values.dtype, np.integer) and \
            not np.all(np.mod(values, 1) == 0):
        return None
    return [int(v) for v in values]


def _timed_fetch(function: Any, model: Any, observer: TfDataObserver, owned_iterator: type) -> Any:
    """Keras's train function, its fetches timed: by the graph itself (compiled), or eagerly
    (``run_eagerly=True``: no graph to time in).

    Compiled, Keras's train function is run through nndoctor's own outer ``tf.function``
    (``_own_outer``): Keras's ``multi_step_on_iterator`` traced with its fetch timed, the two
    times returned as an extra output that never reaches Keras (kept as eager tensors, read
    when the span of fetches closes). Keras's own outer function is then never traced, so the
    compiled step is traced and compiled once, as in a plain fit. Its first ``ALWAYS_TIMED``
    calls are timed, then windows (``timing.WINDOW_EVERY``); the calls in between run the same
    function, their times dropped. Where Keras's train function is not shaped as expected (or
    nndoctor's trace of it failed), Keras's own is traced with every fetch's times written to
    nndoctor's variables (``GraphFetchClock``)."""
    calls = itertools.count()
    outers: list[Any] = []  # nndoctor's outer function, once made (None: Keras's is not as expected)

    def train_function(iterator):
        if not observer.enabled or not isinstance(iterator, owned_iterator) \
                or getattr(model, "steps_per_execution", 1) != 1:
            return function(iterator)
        if getattr(model, "run_eagerly", False):
            if iterator not in observer.iterators:
                return function(iterator)
            element = next(iterator)  # timed by the __next__ patch; StopIteration ends the epoch
            # A plain Python iterator takes Keras's per-batch path: the same step on the same batch.
            return function(iter((element,)))
        call = next(calls)
        try:
            if observer.graph_clock is None:  # eagerly: a tf.function creates variables on its first call only
                observer.graph_clock = GraphFetchClock(observer._tf)
            if not outers:
                outers.append(_own_outer(function, observer))
            skippable = outers[0] is not None and call >= ALWAYS_TIMED and call % WINDOW_EVERY >= WINDOW_FETCHES
            timed = observer.graph_fetch(iterator, skippable)
        except Exception as error:  # noqa: BLE001 - observer rule
            observer.session.internal_error("tf.data instrumentation", error)
            return function(iterator)
        failure = None
        if outers[0] is not None:
            try:
                optional, times = outers[0](iterator)
            except (StopIteration, observer._tf.errors.OpError):
                raise  # the data ran out, or the user's step failed: as Keras's own would
            except Exception as error:  # noqa: BLE001 - observer rule: our trace failed, Keras's runs
                outers[0], failure = None, error
            else:
                if timed:
                    observer.graph_stamps(times)
                if not optional.has_value():  # what Keras's closure does with its function's result
                    raise StopIteration
                return optional.get_value()
        if failure is not None:
            observer.timing_trace = True  # Keras's own function, traced with its fetch timed
            try:
                result = function(iterator)  # the user's own error, where it was one, raised as Keras raises it
            finally:
                observer.timing_trace = False
            observer.session.internal_error("tf.data instrumentation", failure)
            return result
        observer.timing_trace = True  # a trace of this call times its get_next
        try:
            return function(iterator)
        finally:
            observer.timing_trace = False

    return mark_wrapper(train_function, function, _nndoctor_timed_fetch=True)


def _keras_outer(function: Any) -> Any:
    """Keras 3's compiled train function is a Python closure ``function(iterator)`` around the
    ``tf.function`` ``multi_step_on_iterator``: that ``tf.function``, or None where the closure
    is not that one (another Keras version)."""
    import tensorflow as tf

    if getattr(function, "__name__", None) != "function" or not function.__closure__:
        return None
    cells = []
    for cell in function.__closure__:
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            continue
    outer = [c for c in cells if isinstance(c, tf.types.experimental.PolymorphicFunction)
             and getattr(c.python_function, "__name__", None) == "multi_step_on_iterator"]
    return outer[0] if len(outer) == 1 else None


def _own_outer(function: Any, observer: TfDataObserver) -> Any:
    """nndoctor's ``tf.function`` in place of Keras's ``multi_step_on_iterator``: the same Python
    function traced with its fetch timed (the timed ``get_next`` appends the two times to
    ``observer.trace_stamps``), returning ``(Keras's optional outputs, [start, end])``. None
    where Keras's train function is not as expected."""
    import tensorflow as tf

    outer = _keras_outer(function)
    if outer is None:
        return None
    python_function = outer.python_function

    def timed_step_on_iterator(iterator):
        stamps: list[Any] = []
        observer.trace_stamps = stamps
        try:
            optional = python_function(iterator)
        finally:
            observer.trace_stamps = None
        if len(stamps) != 1:  # not one timed fetch (not traced the way it was expected)
            raise RuntimeError(f"Keras's train function fetched {len(stamps)} times in one step")
        return optional, stamps[0]

    return tf.function(timed_step_on_iterator, reduce_retracing=True, autograph=False)


def install(installation: InstallationProtocol) -> None:
    session = installation.session
    # K106, K107 and D105's tf.data variant become the session's checks; the observer (probe
    # "tf_datasets", which they declare in ``needs``) emits one DatasetIterated event per dataset
    # at the end of the run.
    session.add_checks(framework_checks("tfdata", session.select, session.ignore))
    install_features(installation, tfdata_probes())


def tfdata_probes() -> tuple[Feature, ...]:
    """The tf.data observer's probe (``nndoctor.core.probes.KERAS_PROBES``), installed as a PyTorch probe is."""
    return (Feature("tf_datasets", _install_observer, needed=True),)


def _install_observer(installation: InstallationProtocol) -> None:
    observer = TfDataObserver(installation)
    installation.patcher.on_undo(observer._disable)
    when_imported("tensorflow", lambda tf: observer._guard(lambda: observer.patch_tensorflow(tf)),
                  installation.patcher)
