"""Marking a patch's wrapper function with the original it wraps.

``wrapper.__wrapped__ = original`` keeps ``inspect.signature`` (and nndoctor's own
"is this already ours?" guards) pointing at the original. A function's attributes are not part
of its static type, so mypy rejects the plain assignment; ``functools.wraps`` is no substitute
here, since it also copies the original's ``__dict__`` onto the wrapper (a ``tf.function``'s
whole state, which nndoctor's own attribute probes would then misread).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

Wrapper = TypeVar("Wrapper", bound=Callable[..., Any])


def mark_wrapper(wrapper: Wrapper, original: object, **markers: object) -> Wrapper:
    """Set ``wrapper.__wrapped__ = original`` and each ``markers`` attribute; returns ``wrapper``."""
    function: Any = wrapper  # function attributes are untyped: set them through Any
    function.__wrapped__ = original
    for name, value in markers.items():
        setattr(function, name, value)
    return wrapper
