"""``mark_wrapper``: a patch's wrapper points at its original (``__wrapped__``) and carries
nndoctor's markers, without taking over the original's attributes as ``functools.wraps`` does."""

from __future__ import annotations

import inspect

from nndoctor.instrument.wrapping import mark_wrapper


def test_signature_follows_the_original_and_markers_are_set():
    def fit(model, x=None, *, epochs=1):
        return epochs

    fit.python_function = "a tf.function's own state"  # what functools.wraps would copy over

    def wrapper(*args, **kwargs):
        return fit(*args, **kwargs)

    assert mark_wrapper(wrapper, fit, _nndoctor_timed_fetch=True) is wrapper
    assert wrapper.__wrapped__ is fit
    assert str(inspect.signature(wrapper)) == "(model, x=None, *, epochs=1)"
    assert wrapper._nndoctor_timed_fetch is True
    assert not hasattr(wrapper, "python_function")
    assert wrapper(None, epochs=3) == 3
