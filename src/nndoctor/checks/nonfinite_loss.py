"""N101 non-finite loss: the step at which the loss became NaN/Inf and the first module whose
output became non-finite (traced in the full-instrumentation window, or on the next forward
once a non-finite loss is seen)."""

from __future__ import annotations

import math
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from nndoctor.checks._params import scaler_enabled
from nndoctor.core.events import Backward, ModuleOutput, RunEnd
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.instrument.location import user_location
from nndoctor.instrument.loss_ledger import loss_ledger
from nndoctor.instrument.numerics_probe import (
    FlagRing,
    ModuleRecord,
    PendingFlag,
    first_nonfinite,
    forward_definition,
    observe_module,
    params_finite,
    probe_state,
)


def scalar_is_finite(tensor: Any) -> bool | None:
    """Finiteness of a loss read without a device sync: None when that needs one (CUDA)."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        return True
    if tensor.device.type != "cpu":
        return None
    if tensor.numel() == 1:
        return math.isfinite(tensor.item())  # ~1 µs; item() records nothing for autograd
    with torch.no_grad():
        return bool(torch.isfinite(tensor.detach()).all())


@dataclass(frozen=True)
class NonfiniteOrigin:
    """Where a non-finite loss came from, as N101 words it (plain data, unit-testable)."""

    loss_step: int
    traced_step: int
    module: str | None
    module_type: str | None
    first_module: bool  # the culprit is the first module called in the forward
    inputs_finite: bool | None
    weights_finite: bool | None
    weights_finite_at_loss_step: bool | None


def explain_origin(origin: NonfiniteOrigin) -> str:
    """The N101 message: the step, the module, and how sure we are that it is the origin."""
    head = f"The loss became non-finite (NaN/Inf) at step {origin.loss_step}."
    if origin.traced_step != origin.loss_step:
        known = ("all weights were still finite then" if origin.weights_finite_at_loss_step
                 else "weights not checked then" if origin.weights_finite_at_loss_step is None
                 else "some weights were already non-finite then")
        head += (f" That step was not traced ({known}); the next forward, at step "
                 f"{origin.traced_step}, was traced module by module.")
    if origin.module is None:
        return (head + " No module output was non-finite: the NaN/Inf is produced outside the "
                "nn.Modules, in the loss computation (log(0), division by zero, sqrt of a negative, "
                "overflow in a hand-written loss).")
    where = f"`{origin.module}` ({origin.module_type})"
    if origin.inputs_finite is False and origin.first_module:
        return head + f" The input batch already held NaN/Inf: the first module, {where}, received it."
    if origin.weights_finite is False:
        text = (head + f" The first module whose output became non-finite is {where}, whose weights "
                "are already non-finite: an optimizer step applied non-finite gradients.")
        if origin.traced_step != origin.loss_step and origin.weights_finite_at_loss_step:
            text += (f" The step-{origin.loss_step} update is what broke them, so the origin at step "
                     f"{origin.loss_step} is not visible here: rerun with NNDOCTOR_FULL_WINDOW="
                     f"{origin.loss_step + 1} (and a fixed seed) to trace that step exactly.")
        return text
    if origin.inputs_finite is False:
        return head + (f" The first module whose output became non-finite is {where}; its inputs "
                       "were already non-finite, produced by code between modules.")
    return head + (f" The first module whose output became non-finite is {where}, while its inputs "
                   "and weights were finite: the NaN/Inf is created there (overflow, log/sqrt/"
                   "division of out-of-domain values).")


@register
class NonfiniteLoss(Check):
    """
    ## What it does
    Looks at the loss given to ``backward()`` on every step and, when it is NaN or Inf,
    names the step and the first module whose output became non-finite.

    Method and cost (the trade-off):

    - The loss is checked on **every** step, by the hook on ``backward()`` itself (no event
      is built for it). On CPU that is one ``.item()`` (about 2 µs) and the step is known
      at once; on CUDA the loss is copied to pinned host memory without waiting and looked
      at when the copies are next read (the next sampled step at the latest) — no
      synchronisation. The same read serves the other checks of the loss curve (L106,
      L107, L108): one read a step for all of them.
    - During the **full-instrumentation window** (the first 16 steps, where most NaN bugs of
      a new script show up: a ``log`` of 0 on the first batch, a bad initialisation, NaN in
      the data) every submodule's output gets one reduction as it completes (its float sum:
      NaN and Inf propagate through it; no mask as large as the activation is allocated).
      On CUDA the sums stay on the device and are read in one copy only when the loss turns
      out non-finite; a module whose input is the unchanged output of an earlier module
      reuses that module's flag. A NaN that appears in the window is traced exactly: the
      first module, in completion order, whose output was non-finite while its inputs and
      weights were finite.
    - When the loss first turns non-finite on an **untraced** step, nndoctor arms global
      forward hooks for the next forward only (they are not registered at all otherwise,
      so untraced steps pay nothing) and traces that forward. If the weights are still
      finite there (GradScaler skipped the step, or the problem is in the data or an op),
      the module found is the origin. If the bad step's update already made the weights
      non-finite, the message says so and gives the exact command to trace that step:
      ``NNDOCTOR_FULL_WINDOW=<step+1>``, which makes the step fully instrumented.
    - With an enabled ``GradScaler`` an occasional Inf loss is a float16 overflow that the
      scaler skips: the finding waits for the third non-finite loss.
    - Why not trace every step (or every sampled step): tracing reads every activation
      once and costs Python bookkeeping per module. Measured on ResNet-50 (batch 128, bf16,
      channels-last, H200, one step 29 ms): a traced step costs about +7 ms. After the
      window, later sampled steps are left to the arm-on-failure path above, so a NaN that
      comes from one batch and is gone by the next forward is reported with its step but
      without a module; ``NNDOCTOR_FULL_WINDOW`` traces it.

    On Keras 3 and TensorFlow the same code fires, naming the first *layer* whose output is
    non-finite (by name and class). ``fit`` reports the first NaN/Inf ``loss`` its callbacks
    see (the same value ``keras.callbacks.TerminateOnNaN`` reads); when the training step runs
    eagerly on the CPU (the torch backend, or ``run_eagerly=True``) the loss is read inside
    the step, before the update, and the failing batch is run again through the layers one
    by one with ``Layer.stateless_call`` (no variable is assigned, random layers run in
    inference mode: the model is not changed). On a compiled TensorFlow step the batch is
    not visible, so a few samples of the data given to ``fit`` are run after the update and
    the message says whether the layer's weights were already non-finite. Eager custom
    ``GradientTape`` loops are checked at ``tape.gradient(loss, ...)``: the batch given to
    the model under the tape is run again before the optimizer step. Inside ``tf.function``
    nothing is read (an extra reader in the graph can change the computed numbers): a
    compiled training step (a ``tf.function`` that applies the optimizer) is checked on the
    loss it returns (the value itself, the first item of a tuple, or a dict's ``"loss"``), after
    the call, so the step and the calling line are named but not the layer; the message says to
    run it again with ``tf.config.run_functions_eagerly(True)`` (the eager path above then names
    the layer) or with ``tf.debugging.enable_check_numerics()``, the exact but slow alternative.

    ## Why is this bad?
    Once the loss is NaN, every gradient and then every weight becomes NaN; training is
    over while the loop keeps running . The traceback-free symptom gives no hint of the cause; the first
    module that produced the NaN does: a ``log``/``sqrt`` of a value that reached its domain
    edge, an overflow in float16, a division by a zero norm, or NaN already in the data.

    ## Example
    ```python
    class LogFeatures(nn.Module):
        def forward(self, x):
            return torch.log(x)            # x can be <= 0
    ```

    ## Use instead
    ```python
    class LogFeatures(nn.Module):
        def forward(self, x):
            return torch.log(x.clamp_min(1e-6))
    ```
    Also: lower the learning rate or clip gradients when the NaN follows exploding
    gradients (O104), use ``F.log_softmax``/``BCEWithLogitsLoss`` instead of ``log(softmax)``,
    and check the data for NaN (D106).

    ## References
    - PyTorch docs, ``torch.autograd.detect_anomaly`` (the exact but slow alternative): https://pytorch.org/docs/stable/autograd.html#anomaly-detection
    - Keras, ``TerminateOnNaN`` callback: https://keras.io/api/callbacks/terminate_on_nan/
    - Keras, ``Layer.stateless_call``: https://keras.io/api/layers/base_layer/#statelesscall-method
    - TensorFlow, ``tf.debugging.enable_check_numerics``: https://www.tensorflow.org/api_docs/python/tf/debugging/enable_check_numerics
    """

    code = "N101"
    name = "nonfinite-loss"
    severity = Severity.ERROR
    summary = "NaN/Inf loss, naming the first module whose output became non-finite"
    fix = ("fix the module named in the message (clamp before log/sqrt, add eps to divisions, "
           "use log_softmax/BCEWithLogitsLoss), lower the learning rate or clip gradients")
    needs = frozenset({"nonfinite_tracer"})
    SCALER_TOLERANCE = 3

    def __init__(self, session) -> None:
        super().__init__(session)
        self._records: list[ModuleRecord] = []
        self._modules: list[weakref.ref] = []
        self._records_step: int | None = None
        # The session's loss ledger reads a scalar loss once for N101, L106, L107 and L108; the
        # backward hook records each training loss there and it announces a non-finite one.
        self._ledger = loss_ledger(session, follow_backward=True)
        self._ledger.on_nonfinite(self._nonfinite_loss)
        self._frame_hint: Any = None  # the backward() call of a sampled step that waits for its loss
        self._armed_at = 0  # backward() calls counted when the trace was armed
        self._pending: deque[PendingFlag] = deque()  # flags of CUDA losses of more than one element
        self._ring: FlagRing | None = None
        self._site_key: tuple[int, int] | None = None
        self._site: Location | None = None
        self._bad_step: int | None = None
        self._weights_ok_at_bad: bool | None = None
        self._awaiting_trace = False
        self._bad_count = 0
        self._scaled = False
        self._finding: tuple[str, Location | None, dict, int] | None = None
        self._done = False

    # -- recording module outputs ------------------------------------------------------------
    def _record(self, step: int, qualname: str, module: Any, inputs: Any, output: Any,
                root: Any, locate: Any) -> None:
        if step != self._records_step:
            self._records, self._modules, self._records_step = [], [], step
        record = observe_module(qualname, module, inputs, output, self._records)
        if record is None:
            return
        if isinstance(record.output_finite, torch.Tensor):
            # CUDA: which module it will be is known only later, so every record gets a
            # place — its own forward when user-written, else the line that called the
            # model, walked once per forward rather than once per module.
            record.location = forward_definition(module) or self._call_site(step, root, locate)
        elif record.output_finite is False and all(r.output_finite is not False for r in self._records):
            # CPU: resolved for the first non-finite module only, exactly.
            record.location = forward_definition(module) or locate()
        self._records.append(record)
        self._modules.append(weakref.ref(module))

    def _call_site(self, step: int, root: Any, locate: Any) -> Location | None:
        key = (step, id(root))
        if self._site_key != key:
            self._site_key, self._site = key, locate()
        return self._site

    def _traces_sampled(self, step: int) -> bool:
        """Sampled steps record every module inside the window, or once a trace is armed."""
        return step < self.session.full_window or self._awaiting_trace

    def on_module_output(self, event: ModuleOutput) -> None:
        if self._done or self._finding is not None or not self._traces_sampled(event.step):
            return
        self._record(event.step, event.qualname, event.module, event.inputs, event.output,
                     event.root, lambda: event.location)

    def _traced(self, qualname: str, module: Any, inputs: Any, output: Any, root: Any) -> None:
        session = self.session
        if session.sampled and session.wants("module_output") and self._traces_sampled(session.step):
            return  # module_output events already record this step
        self._record(session.step, qualname, module, inputs, output, root, user_location)

    # -- the loss ------------------------------------------------------------------------------
    # A one-element loss reaches N101 through the loss ledger, with no handler call a step: the
    # backward hook records it, and the ledger announces a NaN/Inf value as soon as it is on the
    # host (``_nonfinite_loss``: at once on the CPU, when its copy lands on CUDA). ``on_backward``
    # runs on sampled steps (and on every step while a trace is armed): a loss of several
    # elements is flagged there, and an armed trace concludes at the next backward.
    def on_backward(self, event: Backward) -> None:
        if self._done:
            return
        if not event.sampled and not self._awaiting_trace and not self._pending:
            self.session.every_step(self, False, "backward")  # the trace concluded since
            return
        tensor = event.tensor
        # The losses the backward hook records in the ledger (its own test): announced from there.
        if (type(tensor) is torch.Tensor or isinstance(tensor, torch.Tensor)) \
                and (not tensor.ndim or tensor.numel() == 1) and tensor.dtype.is_floating_point:
            if tensor.device.type != "cpu" and event.sampled and self._traces_sampled(event.step) \
                    and self._finding is None and not self._awaiting_trace:
                # Where this step's modules were recorded, the answer decides the trace: wait
                # for the copy now (a sampled step may synchronise); a NaN is announced by it.
                self._frame_hint = event.frame
                self._ledger.value(self._ledger.record(tensor))
                self._frame_hint = None
            finite: bool | None = True
        elif isinstance(tensor, torch.Tensor):
            finite = scalar_is_finite(tensor)
            if finite is None:
                finite = self._device_check(event)
        else:
            finite = True
        if finite is False:
            self._bad_count += 1
        if self._awaiting_trace and self.session.state.backwards_with_values > self._armed_at:
            self._conclude(event.step, event.location)  # the forward after the non-finite loss
        elif finite is False and self._finding is None and not self._awaiting_trace:
            self._first_bad(event.step, event.location)
        if self._pending:  # flags of CUDA losses of several elements in flight
            self._poll()
        if event.sampled:
            self._ledger.poll()  # CUDA losses whose copies landed: a NaN among them is announced
        if self._finding is not None:
            self._emit_if_due()

    def _nonfinite_loss(self, serial: int, step: int, frame: Any) -> None:
        """The ledger's announcement of a NaN/Inf loss given to backward() (``frame``: that
        call's, when the value was read at once)."""
        if self._done:
            return
        self._bad_count += 1
        if self._finding is None and not self._awaiting_trace and self._bad_step is None:
            frame = frame if frame is not None else self._frame_hint
            self._first_bad(step, user_location(frame) if frame is not None else None)
        if self._finding is not None:
            self._emit_if_due()

    def _emit_if_due(self) -> None:
        """Report now — or, with an enabled GradScaler, once non-finite losses recur.

        Under float16 autocast an occasional overflow makes one loss Inf; the scaler skips
        that step and training goes on. Only the third non-finite loss is reported then.
        """
        if self._finding is None or self._done:
            return
        ref = self.session.state.scaler
        scaler = ref() if ref is not None else None
        if scaler is not None and scaler_enabled(scaler):
            self._scaled = True  # remembered: at the end of a script its scaler may be gone
        if self._scaled and self._bad_count < self.SCALER_TOLERANCE:
            return
        message, location, evidence, step = self._finding
        evidence["nonfinite_losses_seen"] = self._bad_count
        self.report(message, location=location, evidence=evidence, step=step)
        self._done = True

    def _device_check(self, event: Backward) -> bool:
        tensor = event.tensor.detach()  # detached: the flag records nothing for autograd (no no_grad frames)
        # A loss (one element): isfinite alone is the flag, one kernel where .all() made two.
        flag = torch.isfinite(tensor.reshape(())) if tensor.numel() == 1 else torch.isfinite(tensor).all()
        # Read at once where modules were recorded (the answer decides the trace); elsewhere
        # through the pinned ring, without a synchronisation.
        if (event.sampled and self._traces_sampled(event.step)) or self._ring is None:
            if self._ring is None and tensor.device.type == "cuda":
                self._ring = FlagRing()  # allocated once, on a step that may synchronise
            return bool(flag)
        # A slot is reused only after its flag was read: at most len(ring) in flight.
        if len(self._pending) < len(self._ring):
            self._pending.append(PendingFlag(flag, event.step, self._ring.take()))
        return True

    def _poll(self) -> None:
        while self._pending and self._pending[0].ready():
            pending = self._pending.popleft()
            if not pending.value:
                self._nonfinite_later(pending.step)

    def _nonfinite_later(self, step: int) -> None:
        """A loss of several elements found non-finite after its step (CUDA, polled)."""
        self._bad_count += 1
        if self._bad_step is None:
            self._bad_step = step
            self._arm()

    def _first_bad(self, step: int, location: Location | None) -> None:
        self._bad_step = step
        if self._records_step == step and self._records:
            self._conclude(step, location)  # a traced step: exact answer now
            return
        self._weights_ok_at_bad = self._trained_weights_finite()
        self._arm()

    def _arm(self) -> None:
        tracer = probe_state(self.session).tracer
        if tracer is None:
            return
        self._awaiting_trace = True
        # Concluded at the next backward(), on whatever step it comes.
        self._armed_at = self.session.state.backwards_with_values
        self.session.every_step(self, True, "backward")
        self._records, self._modules, self._records_step = [], [], None
        tracer.arm(self._traced)

    def _trained_weights_finite(self) -> bool | None:
        roots = self.session.state.trained_roots()
        if not roots:
            return None
        if any(p.device.type != "cpu" for r in roots for p in r.parameters()):
            return None  # would need a sync on an untraced step
        return all(params_finite(r) for r in roots)

    def _conclude(self, step: int, location: Location | None) -> None:
        tracer = probe_state(self.session).tracer
        if tracer is not None:
            tracer.disarm()
        self._awaiting_trace = False
        records = self._records if self._records_step == step else []
        culprit = first_nonfinite(records)
        weights = None
        if culprit is not None:
            module = self._modules[records.index(culprit)]()
            weights = params_finite(module) if module is not None else None
        bad = self._bad_step if self._bad_step is not None else step
        origin = NonfiniteOrigin(
            loss_step=bad, traced_step=step,
            module=culprit.qualname if culprit else None,
            module_type=culprit.module_type if culprit else None,
            first_module=bool(records) and culprit is records[0],
            inputs_finite=culprit.input_finite if culprit else None,
            weights_finite=weights, weights_finite_at_loss_step=self._weights_ok_at_bad,
        )
        where = culprit.location if culprit is not None else None
        evidence = {"step": bad, "traced_step": step, "module": origin.module,
                    "module_type": origin.module_type, "module_inputs_finite": origin.inputs_finite,
                    "module_weights_finite": weights}
        self._finding = (explain_origin(origin), where or location, evidence, bad)
        self._records, self._modules = [], []

    def on_run_end(self, event: RunEnd) -> None:
        if not self._done:
            self._ledger.flush()  # the last CUDA losses: a NaN among them is announced
        if self._awaiting_trace and not self._done:
            self._conclude(self._records_step if self._records_step is not None else event.step, None)
        self._emit_if_due()
