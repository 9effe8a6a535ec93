"""Training loops without torch.optim: ``p -= lr * p.grad`` under ``no_grad`` or
``p.data.add_(-lr * p.grad)``. No optimizer hook ever fires for them, so without this module
the run counts zero steps, nothing is sampled past the first window and ``--max-steps``
cannot stop it.

Recognised at the next top-level forward with gradients of a model that a ``backward()``
has gone through since its previous forward: if its parameters were written in between
(version counters moved, or for ``.data`` writes, which keep the version, a small value
fingerprint changed) the loop updates by hand, and that forward opens a new step. Once
seen, the pattern is trusted: later forward-after-backward transitions count as steps
without reading values again, so no device synchronisation is added to a GPU loop.
Nothing here runs once a torch optimizer exists.

Each recognised step is also a ``ManualStep`` event (when a check subscribes to it), so the
checks of the step boundary (O101 missing ``zero_grad``, M106 parameters not changing) see
hand-written loops too.
"""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parameter import UninitializedParameter

from nndoctor.core.engine import StopRun
from nndoctor.core.events import ManualStep
from nndoctor.instrument.stats import has_plain_values

if TYPE_CHECKING:
    from nndoctor.instrument.torch_hooks import Installation

_FINGERPRINT_PARAMS = 4
_FINGERPRINT_VALUES = 8


class ManualStepDetector:
    def __init__(self, installation: Installation) -> None:
        self._installation = weakref.ref(installation)
        self._seen: weakref.WeakKeyDictionary[Any, tuple[int, int, Any]] = weakref.WeakKeyDictionary()
        self.confirmed = False
        self.handle: Any = None

    def forward_pre(self, module: Any, args: tuple) -> None:
        installation = self._installation()
        # Only a top-level call (our torch_hooks pre-hook already pushed it): nested module
        # calls leave after one length test.
        if installation is None or len(installation._stack) != 1 or torch.compiler.is_compiling():
            return None
        session = installation.session
        state = session.state
        if len(state.optimizers):
            # A torch optimizer counts the steps: this hook is not needed any more (torch
            # iterates over a copy of the hooks, so removing it here is safe).
            if self.handle is not None:
                self.handle.remove()
            return None
        if not session.active or installation._stack[0] is not module or not torch.is_grad_enabled():
            return None
        try:
            stepped = self._observe(module, state)
        except Exception as error:  # noqa: BLE001 - observer rule
            session.internal_error("manual step detector", error)
            return None
        if stepped:
            session.count_manual_step()
            if session.wants(ManualStep.kind):
                session.emit(ManualStep(step=session.step, sampled=session.sampled,
                                        frame=sys._getframe(1), module=module))
            if session.should_stop():
                raise StopRun(f"--max-steps {session.max_steps} reached")
        return None

    def _observe(self, module: Any, state: Any) -> bool:
        backwards = state.backwards_since_step  # never reset without an optimizer: a total
        previous = self._seen.get(module)
        if previous is not None and previous[0] == backwards:
            return False  # no backward since this model's last forward: nothing to count
        params = [p for p in module.parameters() if p.requires_grad]
        if not params or any(isinstance(p, UninitializedParameter) or not has_plain_values(p) for p in params):
            return False  # lazy modules before their first call; meta/fake models hold no values
        versions = sum(p._version for p in params)
        fingerprint = None if self.confirmed else _fingerprint(params)
        self._seen[module] = (backwards, versions, fingerprint)
        if previous is None:
            return False
        if self.confirmed:
            return True
        written = versions != previous[1] or (
            fingerprint is not None and previous[2] is not None
            and not torch.equal(fingerprint, previous[2]))
        if written:
            self.confirmed = True
        return written


def _fingerprint(params: list[torch.Tensor]) -> torch.Tensor | None:
    """The first few values of a few parameters, copied (``.data`` writes keep the version)."""
    with torch.no_grad():
        pieces = [p.detach().reshape(-1)[:_FINGERPRINT_VALUES].float().cpu()
                  for p in params[:_FINGERPRINT_PARAMS] if p.numel()]
    return torch.cat(pieces) if pieces else None


def install(installation: Installation) -> None:
    from torch.nn.modules import module as module_mod

    detector = ManualStepDetector(installation)
    detector.handle = module_mod.register_module_forward_pre_hook(detector.forward_pre)
    installation.patcher.on_undo(detector.handle.remove)
