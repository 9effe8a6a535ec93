"""nndoctor's Keras callback keeps Keras's asynchronous batch-end dispatch: a callback that
overrides a batch-end hook makes ``CallbackList`` convert every step's logs to Python numbers on
the training thread (measured on the Keras ``fit`` overhead benchmark)."""

from __future__ import annotations

import pytest

keras = pytest.importorskip("keras")


def test_callback_overrides_no_batch_end_hook():
    from keras.src import utils

    from nndoctor.keras.instrument import _make_callback_class

    callback = _make_callback_class(keras, observer=None)()
    for hook in ("on_batch_end", "on_train_batch_end", "on_test_batch_end", "on_predict_batch_end"):
        assert utils.is_default(getattr(callback, hook)), hook
    callbacks = keras.callbacks.CallbackList([callback])
    assert callbacks._async_train == keras.src.backend.IS_THREAD_SAFE


class _AcceleratorScalar:
    """A 0-d tensor on a GPU, as Keras's torch backend returns ``logs["loss"]``: reading it waits
    for the step that computed it (here: counted)."""

    def __init__(self, value: float, reads: list[float]) -> None:
        self.value, self.reads = value, reads
        self.shape = ()
        self.device = type("Device", (), {"type": "cuda"})()

    def __float__(self) -> float:
        self.reads.append(self.value)
        return self.value


def _fit_observer():
    from nndoctor.core.engine import Session
    from nndoctor.core.registry import framework_checks
    from nndoctor.keras.instrument import KerasObserver, _Call

    session = Session(select=["N101", "L106"])
    session.add_checks(framework_checks("keras", session.select))  # what KerasObserver.patch does
    observer = KerasObserver(type("Installation", (), {"session": session, "probes": []})())
    assert "fit_losses" in session.needed_probes()
    observer.reads_losses = True  # what installing the probe "fit_losses" (N101, L106 need it) turns on
    call = _Call("fit", None, means=[])
    observer.calls.append(call)
    return session, observer, call


def test_accelerator_losses_are_read_two_batches_late_in_order():
    from nndoctor.keras.instrument import LOSS_LAG

    reads: list[float] = []
    session, observer, call = _fit_observer()
    model = object()
    for batch in range(6):
        call.logs = {"loss": _AcceleratorScalar(10.0 - batch, reads)}
        observer.settle_batch(model, batch, flush=False)
        session.step += 1  # the callback counts the step after settling the batch
        assert len(reads) == max(0, batch + 1 - LOSS_LAG)  # never the batch that just finished
    call.logs = None
    observer.settle_batch(model, 6, flush=True)  # epoch end: everything left is read
    assert reads == [10.0 - b for b in range(6)]
    assert call.means == [(b, 10.0 - b) for b in range(6)]


def test_a_nan_accelerator_loss_names_its_own_step():
    reads: list[float] = []
    session, observer, call = _fit_observer()
    model = object()
    for batch, value in enumerate([2.0, 1.5, float("nan"), float("nan"), float("nan")]):
        call.logs = {"loss": _AcceleratorScalar(value, reads)}
        observer.settle_batch(model, batch, flush=batch == 4)
        session.step += 1
    found = [f for f in session.report.findings if f.code == "N101"]
    assert len(found) == 1 and found[0].evidence["step"] == 2, found  # read at step 4, reported as step 2


def test_cpu_losses_are_read_at_once():
    session, observer, call = _fit_observer()
    for batch in range(3):
        call.logs = {"loss": 1.0 / (batch + 1)}
        observer.settle_batch(object(), batch, flush=False)
        assert len(call.means) == batch + 1
