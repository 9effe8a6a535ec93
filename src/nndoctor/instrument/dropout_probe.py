"""Functional dropout left on in eval mode (M110): ``F.dropout(x, p)`` inside ``forward``.

``F.dropout``'s ``training`` argument defaults to True and knows nothing of the module's
mode, so a forward that calls it without ``training=self.training`` keeps dropping
activations after ``model.eval()``. The wrapper installed here looks at each call from
user code: ``training`` not given, ``p > 0``, and the module whose forward is running (the
top of torch_hooks' module stack) in eval mode. An explicit ``training=True`` is left alone:
Monte-Carlo dropout asks for exactly that. Records are plain data, taken by the check.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from nndoctor.core.findings import Location
from nndoctor.core.stash import StashKey
from nndoctor.core.user_code import user_location

if TYPE_CHECKING:
    from nndoctor.instrument.torch_hooks import Installation

_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


@dataclass(frozen=True)
class EvalDropoutCall:
    function: str
    p: float
    module_type: str
    location: Location | None
    step: int


class DropoutRecords:
    def __init__(self) -> None:
        self.pending: list[EvalDropoutCall] = []
        self.seen_locations: set[Location | None] = set()
        # Called when a call becomes pending (M110 arms its forward handler: idle otherwise).
        self.on_pending: Callable[[], None] | None = None

    def take(self) -> list[EvalDropoutCall]:
        records, self.pending = self.pending, []
        return records


DROPOUT_RECORDS = StashKey[DropoutRecords]("functional dropout calls in eval mode")


def dropout_records(session: Any) -> DropoutRecords:
    return session.stash.get_or_create(DROPOUT_RECORDS, DropoutRecords)


def install(installation: Installation) -> None:
    # Installed only when a check needs "dropout_calls" (M110): otherwise F.dropout stays
    # untouched (instrument/extensions.py).
    records = dropout_records(installation.session)
    for name in _FUNCTIONS:
        original = getattr(F, name, None)
        if original is not None:
            installation.patcher.patch(F, name, _wrap(installation, records, name, original))


def _wrap(installation: Installation, records: DropoutRecords, name: str, original: Any) -> Any:
    session = installation.session

    def record(p: Any, frame: Any) -> None:
        stack = installation._stack
        module = stack[-1] if stack else None
        if module is None or module.training:
            return
        location = user_location(frame)
        if location in records.seen_locations:
            return
        records.seen_locations.add(location)
        records.pending.append(EvalDropoutCall(name, float(p), type(module).__name__, location, session.step))
        if records.on_pending is not None:
            records.on_pending()

    @functools.wraps(original)
    def dropout(input, p=0.5, *args, **kwargs):
        # ``training`` is the first of ``args`` when given by position.
        if (session.active and not args and "training" not in kwargs
                and not torch.compiler.is_compiling()):
            try:
                if float(p) > 0:
                    record(p, sys._getframe(1))
            except Exception as error:  # noqa: BLE001 - observer rule
                session.internal_error("dropout probe", error)
        return original(input, p, *args, **kwargs)

    return dropout
