"""The TensorBoard event file, read back with TensorBoard's own reader."""

from __future__ import annotations

import pytest

from nndoctor.report.tensorboard import write_tensorboard

pytest.importorskip("tensorboard")


def test_scalars_and_findings_read_back(observed_report, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    write_tensorboard(observed_report, tmp_path / "tb")
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"nndoctor/loss", "nndoctor/grad_norm/total", "nndoctor/input/max", "nndoctor/step_time_s",
            "nndoctor/update_ratio/0", "nndoctor/activations/relu_zero/1"} <= scalars
    loss = events.Scalars("nndoctor/loss")
    history = observed_report.history.loss
    assert [e.step for e in loss] == history.steps
    assert [e.value for e in loss] == pytest.approx(history.values, rel=1e-6)
    tensors = set(events.Tags()["tensors"])
    assert "nndoctor/findings/O101" in tensors and "nndoctor/report" in tensors
    o101 = events.Tensors("nndoctor/findings/O101")[0]
    text = tensor_util.make_ndarray(o101.tensor_proto).item().decode()
    first = next(f for f in observed_report.findings if f.code == "O101")
    assert o101.step == first.first_step
    assert "missing-zero-grad" in text and "fix:" in text


def test_a_local_folder_is_written_without_tensorflow(observed_report, tmp_path, monkeypatch):
    """TensorBoard's EventFileWriter opens its file through ``tf.io.gfile``, which imports
    TensorFlow where it is installed (seconds, and its log lines in a PyTorch user's output):
    a local folder is written without it, and reads back the same."""
    import tensorboard.compat
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.summary.writer import event_file_writer

    class NoTensorFlow:
        def __getattr__(self, name):
            raise AssertionError(f"tf.{name} used: that imports TensorFlow")

    monkeypatch.setattr(tensorboard.compat, "tf", NoTensorFlow())
    monkeypatch.setattr(event_file_writer, "tf", NoTensorFlow())
    write_tensorboard(observed_report, tmp_path / "tb")
    monkeypatch.undo()
    [written] = (tmp_path / "tb").glob("events.out.tfevents.*.nndoctor")
    events = EventAccumulator(str(written), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("nndoctor/loss")] == observed_report.history.loss.steps
    assert "nndoctor/report" in events.Tags()["tensors"]
