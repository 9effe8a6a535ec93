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
