"""Event subscribers: any object that receives the engine's events through ``on_<kind>`` methods.

Catalog checks are subscribers, and so are the engine's internal helpers (the perf recorder,
the preflight probe, the ``--try`` injector and step clock, the report's history): those have
no catalog code, so they are not checks — they only say what to call them when they fail.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from nndoctor.core.events import EVENT_KINDS


class Subscriber(Protocol):
    """Defines ``on_<event kind>(event)`` for the kinds it wants (``on_forward``, ``on_run_end`` …)."""

    # Shown in internal-error messages when one of its handlers raises (read-only: a class
    # attribute or a property).
    @property
    def subscriber_name(self) -> str: ...


_SAMPLED_ONLY = "__nndoctor_sampled_only__"
_Handler = TypeVar("_Handler", bound=Callable[..., Any])


def sampled_only(handler: _Handler) -> _Handler:
    """Mark an ``on_<kind>`` handler that does nothing for an event of an unsampled step.

    The engine then never calls it outside sampled steps (``Session.emit``), and the
    instrumentation skips building an event that no handler wants then: that is what makes an
    unsampled step cost microseconds. Mark only handlers whose first statement returns when
    ``not event.sampled``, so the mark changes no diagnosis.
    """
    setattr(handler, _SAMPLED_ONLY, True)
    return handler


def is_sampled_only(handler: Any) -> bool:
    return bool(getattr(getattr(handler, "__func__", handler), _SAMPLED_ONLY, False))


_MODEL_FORWARDS_ONLY = "__nndoctor_model_forwards_only__"
# The route of a loss module's own forward (``criterion(output, y)`` called from user code): a
# Forward event with ``is_loss`` set, sent only to the ``on_forward`` handlers not marked
# ``model_forwards_only``.
LOSS_FORWARD = "forward/loss"


def model_forwards_only(handler: _Handler) -> _Handler:
    """Mark an ``on_forward`` handler whose first statement returns when ``event.is_loss``:
    the engine then does not call it for a loss module's forward (two forwards a step, one of
    them the loss's, reach every ``on_forward`` handler otherwise)."""
    setattr(handler, _MODEL_FORWARDS_ONLY, True)
    return handler


def is_model_forwards_only(handler: Any) -> bool:
    return bool(getattr(getattr(handler, "__func__", handler), _MODEL_FORWARDS_ONLY, False))


_SAMPLED_TRAINING_FORWARDS = "__nndoctor_sampled_training_forwards__"
# The route of the usual forward of an unsampled step: a model's (not a loss module's), with
# autograd recording and the model in training mode. It reaches only the ``on_forward``
# handlers not marked ``sampled_training_forwards``; when none is left, the step's forward
# builds no event at all.
TRAINING_FORWARD = "forward/training"


def sampled_training_forwards(handler: _Handler) -> _Handler:
    """Mark an ``on_forward`` handler that needs a model's training forwards (autograd on, the
    model in ``train()`` mode) of sampled steps only: it does nothing with them otherwise, or
    what it learns from them, the sampled steps teach it too. Its other forwards (evaluation
    under ``no_grad``, a model in ``eval()`` mode, any forward of a sampled step) still reach
    it on every step. A validation pass runs at one step number, sampled or not, so a handler
    that watches evaluation must not rely on sampled steps for it."""
    setattr(handler, _SAMPLED_TRAINING_FORWARDS, True)
    return handler


def is_sampled_training_forwards(handler: Any) -> bool:
    return bool(getattr(getattr(handler, "__func__", handler), _SAMPLED_TRAINING_FORWARDS, False))


_SAMPLED_TRAINING_LOSSES = "__nndoctor_sampled_training_losses__"
# The route of the usual loss of an unsampled step: computed with autograd recording (a
# training loss). It reaches only the ``on_loss`` handlers not marked
# ``sampled_training_losses``; when none is left, the step's loss builds no event.
TRAINING_LOSS = "loss/training"


def sampled_training_losses(handler: _Handler) -> _Handler:
    """Mark an ``on_loss`` handler that needs the training losses (autograd on) of sampled
    steps only — it follows the training loss through the loss ledger's record of every loss
    given to ``backward()`` — but every loss computed without gradients (an evaluation's)."""
    setattr(handler, _SAMPLED_TRAINING_LOSSES, True)
    return handler


def is_sampled_training_losses(handler: Any) -> bool:
    return bool(getattr(getattr(handler, "__func__", handler), _SAMPLED_TRAINING_LOSSES, False))


def handler_names(cls: type) -> dict[str, str]:
    """Event kind -> method name, for every ``on_<kind>`` the class defines."""
    found = {}
    for kind in EVENT_KINDS:
        method = f"on_{kind}"
        if callable(getattr(cls, method, None)):
            found[kind] = method
    return found


def stray_handlers(cls: type) -> list[str]:
    """``on_*`` methods that match no event kind: a misspelt handler is never called."""
    return sorted(n for n in dir(cls) if n.startswith("on_") and n[3:] not in EVENT_KINDS
                  and callable(getattr(cls, n, None)))


def describe(subscriber: Any) -> str:
    return str(getattr(subscriber, "subscriber_name", None) or type(subscriber).__name__)
