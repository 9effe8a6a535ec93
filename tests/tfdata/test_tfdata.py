"""K106/K107 on tf.data pipelines, run in-process like the other fixtures (one TensorFlow import
per worker), plus the pure parts (timing, label order, pipeline reading) on plain values."""

from __future__ import annotations

import pytest

from nndoctor.core.findings import Severity
from nndoctor.tfdata.labels import batch_summary, ordered_evidence
from nndoctor.tfdata.timing import FetchClock
from tests.conftest import FIXTURES, expected_lines, in_process_tensorflow, run_script

TFDATA = FIXTURES / "tfdata"
BUGGY = sorted(TFDATA.glob("buggy_*.py"))
CORRECT = sorted(TFDATA.glob("correct_*.py"))


def test_clock_leaves_out_start_up_and_measures_the_share():
    clock = FetchClock()
    clock.new_iterator()
    t = 0.0
    for _ in range(12):  # each step: 3 ms waiting, then 7 ms of training
        clock.fetched(t, t + 0.003)
        t += 0.010
    assert clock.measured == 12 - 3  # two fetches skipped, and the last one ends no period
    assert clock.wait_share == pytest.approx(0.3)
    assert clock.median_wait_ms == pytest.approx(3.0)
    assert clock.epochs == 1


def test_clock_does_not_count_the_gap_between_epochs():
    clock = FetchClock()
    for epoch in range(2):
        clock.new_iterator()
        t = 100.0 * epoch
        for _ in range(6):
            clock.fetched(t, t + 0.001)
            t += 0.004
    assert all(p == pytest.approx(0.004) for p in clock.periods)
    assert clock.epochs == 2


def test_graph_timed_windows_of_one_iterator_count_one_epoch_and_no_period_across_a_gap():
    # A compiled Keras train function past its first calls times windows of fetches: each window
    # is handed to the dataset's clock as a span, the later spans of the same iterator resumed.
    from types import SimpleNamespace

    from nndoctor.tfdata.instrument import TfDataObserver

    class Rows:  # the graph's variable: (start, end) of every timed fetch, in order
        def __init__(self):
            self.rows = []

        def count(self):
            return len(self.rows)

        def read(self, start):
            return self.rows[start:]

        def want_labels(self, wanted):
            pass

    observer = TfDataObserver.__new__(TfDataObserver)
    observer._segment, observer._last_timed, observer.graph_clock = None, None, Rows()
    record = SimpleNamespace(clock=FetchClock(), wants_labels=False, label_batches=[])

    class Iterator:
        pass

    iterator = Iterator()
    observer.iterators = {iterator: record}
    t = 0.0
    for call in range(40):
        skippable = 10 <= call < 30  # calls 10..29 run untimed
        if observer.graph_fetch(iterator, skippable):
            observer.graph_clock.rows.append((t, t + 0.001))
        t += 0.004
    observer._close_segment()
    assert record.clock.fetches == 20 and record.clock.epochs == 1
    assert all(p == pytest.approx(0.004) for p in record.clock.periods)  # none spans the untimed calls
    assert record.clock.measured == 20 - 3 - 1  # skipped start-up, and one period lost per span end


def test_label_order_rule():
    sorted_batches = [batch_summary([c] * 32) for c in (0, 0, 1, 1, 2)]
    assert ordered_evidence(sorted_batches) == (5, 5, 3)
    mixed = [batch_summary([i % 3 for i in range(j, j + 32)]) for j in range(5)]
    assert ordered_evidence(mixed) is None
    one_class = [batch_summary([0] * 32) for _ in range(5)]  # imbalanced, not ordered
    assert ordered_evidence(one_class) is None


@in_process_tensorflow
def test_pipeline_stages_are_read_without_iterating():
    import tensorflow as tf

    from nndoctor.tfdata.pipeline import read_pipeline

    ds = tf.data.Dataset.from_tensor_slices(tf.range(100)).shuffle(10).map(lambda v: v * 2)
    ds = ds.batch(8).prefetch(tf.data.AUTOTUNE)
    pipeline = read_pipeline(ds)
    assert pipeline.describe() == "TensorSlice → shuffle(10) → map → batch → prefetch(AUTOTUNE)"
    assert pipeline.prefetched() and [s.kind for s in pipeline.sequential_maps()] == ["map"]
    assert pipeline.elements_per_epoch() == 100
    assert not read_pipeline(ds.unbatch().batch(4)).prefetched()


@in_process_tensorflow
def test_every_tfdata_check_has_a_buggy_fixture():
    from nndoctor.core.registry import all_checks

    marked = {code for path in BUGGY for code in expected_lines(path)}
    assert {c.code for c in all_checks("tfdata")} == {"K106", "K107"} <= marked


@in_process_tensorflow
@pytest.mark.parametrize("path", BUGGY, ids=lambda p: p.stem)
def test_buggy_fixture_fires_at_marked_line(path):
    for code, lines in expected_lines(path).items():
        report = run_script(path, select=[code])
        found = report.by_code(code)
        assert found, f"{code} did not fire on {path.name}: {report.internal_errors}"
        assert {f.location.line for f in found if f.location} & lines, [str(f.location) for f in found]
        assert not report.internal_errors, report.internal_errors


@in_process_tensorflow
def test_input_bound_message_states_share_and_missing_stages():
    report = run_script(TFDATA / "buggy_input_bound_loop.py", select=["K106"])
    (finding,) = report.by_code("K106")
    assert finding.evidence["wait_share"] > 0.2 and finding.evidence["median_wait_ms"] > 1
    assert "num_parallel_calls=tf.data.AUTOTUNE" in finding.message and ".prefetch(" in finding.message
    assert "buggy_input_bound_loop.py:21" in finding.message  # the map without num_parallel_calls
    assert finding.evidence["epochs"] == 2 and ".cache()" in finding.message


@in_process_tensorflow
@pytest.mark.parametrize("path", CORRECT, ids=lambda p: p.stem)
def test_correct_pipeline_is_silent(path):
    report = run_script(path, select=["K106", "K107"])
    bad = [f for f in report.findings if f.severity >= Severity.WARNING]
    assert not bad, "\n".join(f"{f.code} {f.location}: {f.message}" for f in bad)
    assert report.status == "completed", report.traceback
    assert not report.internal_errors, report.internal_errors


@in_process_tensorflow
def test_patches_are_undone():
    from tensorflow.python.data.ops import dataset_ops, iterator_ops

    before = (iterator_ops.OwnedIterator.__next__, dataset_ops.DatasetV2.__iter__, dataset_ops.DatasetV2.map)
    run_script(TFDATA / "buggy_small_shuffle_buffer.py")
    after = (iterator_ops.OwnedIterator.__next__, dataset_ops.DatasetV2.__iter__, dataset_ops.DatasetV2.map)
    assert before == after
