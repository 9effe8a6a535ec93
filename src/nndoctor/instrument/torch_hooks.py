"""PyTorch instrumentation: global hooks where torch has them, reversible patches elsewhere.

Hooks used: global optimizer step pre/post hooks. Module calls are observed by a wrapper of
``Module.__call__`` (its exception path records the crashing module), not by global module
forward hooks: those would send every module call down torch's slow path. Other patches
(undone at uninstall): ``Module.train``, ``Module.zero_grad``, ``Optimizer.zero_grad``,
``Tensor.backward`` / ``torch.autograd.backward``, DataLoader iteration, the functional
losses, LR scheduler ``step``, ``Module.load_state_dict``, ``torch.save`` / ``torch.load``,
``GradScaler.scale``.

Deliberately *not* used: global full backward hooks. They wrap every module output in a
``BackwardHookFunction`` and make legal in-place operations on those outputs raise
("Output 0 of BackwardHookFunctionBackward is a view and is being modified inplace") —
that would change the patient. Gradient facts are read from ``.grad`` at step time.

Every wrapper checks ``session.active`` first and otherwise calls straight through, so a
function object captured by the user's code (``from torch.nn.functional import
cross_entropy``) stays harmless after uninstall.
"""

from __future__ import annotations

import functools
import sys
import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.loss import _Loss
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from nndoctor.core import events as ev
from nndoctor.core.engine import Session, StopRun
from nndoctor.core.step_log import LoaderTally
from nndoctor.core.subscribers import LOSS_FORWARD, TRAINING_FORWARD, TRAINING_LOSS
from nndoctor.instrument.features import Feature, install_features
from nndoctor.instrument.patches import Patcher
from nndoctor.run.crash_context import crash_context

_clock = time.perf_counter

# True while dynamo traces (torch.compile): our hooks and wrappers are inlined into the traced
# function then, and Python side effects there (lists, sys._getframe, events) either break the
# trace ("already tracked for mutation") or would be baked into the graph. They step aside; the
# compiled module is still observed from outside, as a top-level call that dynamo does not trace.
# The test is spelled out at each use, ``_dynamo_compiling() or _compiler._is_compiling_flag``:
# one Python call on every module call instead of ``torch.compiler.is_compiling``'s two (it calls
# ``torch.jit.is_scripting``, always False for this never-scripted code, then reads the flag).
# Same answer in every case: while dynamo traces, it replaces ``is_dynamo_compiling`` by the
# constant True (as it does ``is_compiling``), so the flag is never read inside a traced frame (a
# read there would be guarded on, and the flag is False again at run time); outside a traced
# frame ``is_dynamo_compiling`` returns False, and the flag is what ``is_compiling`` returns: True
# in torch.export and for code run by the compiler without being traced (AOTAutograd, make_fx).
_dynamo_compiling = torch.compiler.is_dynamo_compiling
_compiler = torch.compiler

# Functional losses observed when called from user code (not from inside a loss module).
LOSS_FUNCTIONS = (
    "cross_entropy", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "poisson_nll_loss",
    "gaussian_nll_loss", "soft_margin_loss", "multilabel_soft_margin_loss", "margin_ranking_loss",
    "hinge_embedding_loss", "cosine_embedding_loss", "multi_margin_loss", "triplet_margin_loss",
)

# Loss module class -> the functional name it computes (for checks keyed on the function).
_LOSS_MODULE_FUNCTION = {
    "CrossEntropyLoss": "cross_entropy", "NLLLoss": "nll_loss", "BCELoss": "binary_cross_entropy",
    "BCEWithLogitsLoss": "binary_cross_entropy_with_logits", "MSELoss": "mse_loss",
    "L1Loss": "l1_loss", "SmoothL1Loss": "smooth_l1_loss", "HuberLoss": "huber_loss",
    "KLDivLoss": "kl_div", "PoissonNLLLoss": "poisson_nll_loss", "GaussianNLLLoss": "gaussian_nll_loss",
}

_LOSS_OPTION_NAMES = ("reduction", "ignore_index", "label_smoothing", "weight", "pos_weight", "log_target")


class Installation:
    """The installed instrumentation of one session. ``uninstall()`` restores everything."""

    def __init__(self, session: Session, features: Sequence[Feature] = ()) -> None:
        self.session = session
        # The feature installers run after the hooks below (``instrument/extensions.py``).
        self.features = tuple(features)
        self.patcher = Patcher()
        # Module-call stack of the current forward (modules only; popped in the post-hook).
        self._stack: list[Any] = []
        self._in_loss = 0
        self._in_backward = 0
        self._in_train = 0
        self._in_scheduler = 0
        self._last_root: weakref.ref[Any] = _dead_ref  # the model last added to state.roots
        self._last_stepped: weakref.ref[Any] = _dead_ref  # the optimizer last added to state.optimizers
        self._last_stepped_without_values = False  # its parameters are meta or fake (asked once per optimizer)
        self._iterators: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        self._epochs: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._tallies: weakref.WeakKeyDictionary[Any, LoaderTally] = weakref.WeakKeyDictionary()
        self._last_iterator: weakref.ref[Any] = _dead_ref  # the DataLoader pass of the last batch
        self._last_info: dict[str, Any] = {}
        self._names: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()
        # Names of the extra instrumentation installed for this session (instrument/extensions.py):
        # what the enabled checks asked for, besides the core hooks installed here.
        self.probes: list[str] = []

    # -------------------------------------------------------------------------------------
    def install(self) -> Installation:
        session, patcher = self.session, self.patcher
        session.active = True
        try:
            self._install_module_hooks()
            self._install_optimizer_hooks()
            self._install_patches()
            install_features(self, self.features)
        except BaseException:
            self.uninstall()
            raise
        del patcher
        return self

    def uninstall(self) -> None:
        self.session.active = False
        for error in self.patcher.undo_all():
            self.session.internal_error("uninstall", error)

    # -- modules ---------------------------------------------------------------------------
    def _install_module_hooks(self) -> None:
        """Observe module calls by wrapping ``Module.__call__``, not with torch's global forward
        hooks: any global hook sends *every* module call of every step down torch's slow path
        (~2.5 µs a call before our hook does anything: ~0.4 ms a step on a ResNet-50), while the
        wrapper costs a frame, a list push and pop. Torch itself patches ``Module.__call__``
        the same way (``torch.fx`` tracing, ``torch.ao.quantization``)."""
        inst, session, stack = self, self.session, self._stack
        original = torch.nn.Module.__call__
        loss_classes: dict[type, bool] = {}  # module class -> is it a loss module (_Loss)

        @functools.wraps(original)
        def module_call(self, *args, **kwargs):
            # ``self``, as torch names it: crash explanations look for the user's name of the
            # model in the traceback's locals, and skip ``self``.
            if not session.active or _dynamo_compiling() or _compiler._is_compiling_flag:
                return original(self, *args, **kwargs)
            stack.append(self)
            try:  # per class, a subscript: no isinstance call on every module call
                is_loss = loss_classes[type(self)]
            except KeyError:
                is_loss = loss_classes[type(self)] = isinstance(self, _Loss)
            if is_loss:
                inst._in_loss += 1
            try:
                output = original(self, *args, **kwargs)
            except BaseException as error:
                inst._forward_raised(self, args, error, is_loss)
                raise
            if stack and stack[-1] is self:
                stack.pop()  # the usual return: nothing to search
            else:
                inst._pop(self)
            if is_loss and inst._in_loss:
                inst._in_loss -= 1
            # ``session.sampled`` inlined (a property: a call on every module call of every
            # step), the same expression as ``Session.sampled``, and passed on.
            step = session.step
            sampled = step < session.full_window or step % session.sample_every == 0 or session._phase_sampled
            if not stack or is_loss or sampled:
                inst._forward_returned(self, args, kwargs, output, is_loss, sampled)
            return output

        _not_a_compiled_frame(module_call)
        for handler in (Installation._forward_returned, Installation._forward_raised, Installation._pop):
            _not_a_compiled_frame(handler, callees=False)
        self.patcher.patch(torch.nn.Module, "__call__", module_call)

    def _pop(self, module: Any) -> int | None:
        """Pop ``module`` and what a caught exception left above it; its depth, or None."""
        stack = self._stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is module:
                del stack[i:]
                return i
        return None

    def _forward_raised(self, module: Any, args: tuple, error: BaseException, is_loss: bool) -> None:
        """The exception path: remember which module was running, and on what."""
        try:
            stack = self._stack
            path = None
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] is module:
                    path = stack[: i + 1]
                    break
            self._pop(module)
            if is_loss and self._in_loss:
                self._in_loss -= 1
            if path is not None:
                self._record_crash_context(path, args, error)
        except Exception as failure:  # noqa: BLE001 - never mask the user's exception
            self.session.internal_error("forward hook", failure)

    def _forward_returned(self, module: Any, args: tuple, kwargs: dict[str, Any] | None, output: Any,
                          is_loss: bool, sampled: bool) -> None:
        """A top-level call, a loss module, or a submodule on a sampled step returned
        (``sampled``: ``session.sampled``, which the wrapper has read)."""
        session = self.session
        stack = self._stack
        try:
            if not stack:  # a top-level call from user code
                if (type(output) is torch.Tensor and not output.is_meta) or not _without_values(output):
                    self._root_forward(module, args, kwargs, output, is_loss, sampled)
            else:
                if is_loss and not self._in_loss and not _without_values(output):
                    # A loss module the model calls inside its own forward (Hugging Face models
                    # compute CrossEntropyLoss()(logits, labels) in forward when given labels).
                    self._loss_module_called(module, args, output, sys._getframe(2), sampled)
                if sampled and session.wants("module_output") and not _without_values(output):
                    root = stack[0]
                    session.emit(ev.ModuleOutput(
                        step=session.step, sampled=True, module=module,
                        qualname=self.qualname(root, module), root=root, inputs=args, output=output,
                    ))
        except StopRun:
            raise
        except Exception as error:  # noqa: BLE001
            session.internal_error("forward hook", error)

    def _root_forward(self, module: Any, args: tuple, kwargs: dict[str, Any] | None, output: Any,
                      is_loss: bool, sampled: bool) -> None:
        session = self.session
        state = session.state
        grad_enabled = torch.is_grad_enabled()
        if not is_loss:
            state.forwards += 1  # progress, for the stall watchdog
            state.last_progress = "forward"
            if grad_enabled and self._last_root() is not module:
                # WeakSet.add costs three calls and a new weak reference: once per model, not per step.
                state.roots.add(module)
                self._last_root = weakref.ref(module)
                for changed in state.on_loop_change:  # another model trained now (a copy swapped in?)
                    changed()
        if is_loss:
            route = LOSS_FORWARD
        elif not sampled and grad_enabled and module.training:
            route = TRAINING_FORWARD  # the usual forward of an unsampled step: few handlers, often none
        else:
            route = "forward"
        # ``session.wants_now(route, sampled)`` inlined here and in every hook of the hot path: a
        # call fewer per event (the tables are replaced, never changed, so reading them is safe).
        if route in (session._handlers if sampled else session._every_step):
            session.emit(ev.Forward(
                step=session.step, sampled=sampled, frame=sys._getframe(2), module=module,
                inputs=args, kwargs=kwargs or None, output=output, training=module.training, grad_enabled=grad_enabled,
                inference_mode=torch.is_inference_mode_enabled(), is_loss=is_loss,
            ), route)
        if is_loss:
            self._loss_module_called(module, args, output, sys._getframe(2), sampled)

    def _loss_module_called(self, module: Any, args: tuple, output: Any, frame: Any, sampled: bool) -> None:
        session = self.session
        # An unsampled step's training loss takes its own route: few handlers, often none.
        route = "loss" if sampled or not torch.is_grad_enabled() else TRAINING_LOSS
        if route not in (session._handlers if sampled else session._every_step):
            return
        name, options = _loss_module_options(module)
        session.emit(ev.LossComputed(
            step=session.step, sampled=sampled, frame=frame, function=name,
            module=module, input=args[0] if args else None,
            target=args[1] if len(args) > 1 else None, output=output, options=options,
        ), route)

    def qualname(self, root: Any, module: Any) -> str:
        """``layer3.1.conv2`` for a submodule of ``root`` ('' for the root itself)."""
        names = self._names.get(root)
        if names is None:
            names = {id(m): n for n, m in root.named_modules()}
            self._names[root] = names
        name = names.get(id(module))
        if name is None:  # the model changed shape since we looked
            names.clear()
            names.update({id(m): n for n, m in root.named_modules()})
            name = names.get(id(module), type(module).__name__)
        return name

    def _record_crash_context(self, stack: list[Any], args: tuple, error: BaseException) -> None:
        """On the exception path only: remember which module was running, and on what."""
        session = self.session
        record = crash_context(session)
        if record is None or record.exception_id == id(error):
            return  # already recorded at the innermost module
        try:
            from nndoctor.instrument.stats import describe_structure

            root, inner = stack[0], stack[-1]
            params = {
                name: f"{str(p.dtype).replace('torch.', '')}{list(p.shape)}@{p.device}"
                for name, p in list(inner.named_parameters(recurse=False))[:8]
            }
            record.context = {
                "module_path": [self.qualname(root, m) for m in stack],
                "module_qualname": self.qualname(root, inner),
                "module_type": type(inner).__name__,
                "module_repr": repr(inner)[:300] if not list(inner.children()) else type(inner).__name__,
                "root_type": type(root).__name__,
                "inputs": describe_structure(args),
                "parameters": params,
                "training": inner.training,
                "step": session.step,
            }
            record.module = weakref.ref(inner)
            record.exception_id = id(error)
        except Exception as failure:  # noqa: BLE001
            session.internal_error("crash context", failure)

    # -- optimizers ------------------------------------------------------------------------
    def _install_optimizer_hooks(self) -> None:
        pre = register_optimizer_step_pre_hook(self._step_pre)
        post = register_optimizer_step_post_hook(self._step_post)
        self.patcher.on_undo(pre.remove)
        self.patcher.on_undo(post.remove)

    def _step_pre(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        session = self.session
        if not session.active:
            return None
        if self._last_stepped() is not optimizer:  # the usual step: the same optimizer as last time, known
            session.state.optimizers.add(optimizer)  # (a WeakSet: nothing removes a live one)
            self._last_stepped = weakref.ref(optimizer)
            self._last_stepped_without_values = _optimizer_without_values(optimizer)
        step = session.step
        if step < session.full_window or step % session.sample_every == 0:
            sampled = True
        else:  # ``session.step_sampled``: a new phase's optimizer is sampled in its first steps
            sampled = session.step_sampled(optimizer) if session._plain_optimizer() is not optimizer else \
                session.state.steps_of(optimizer) < session.full_window
        state = session.state
        if not state.backwards_since_step:  # no backward() since the last step (or a closure's to come)
            for changed in state.on_loop_change:
                changed()
        if "step_start" in (session._handlers if sampled else session._every_step) and not self._last_stepped_without_values:
            session.emit(ev.StepStart(
                step=session.step, sampled=sampled, frame=sys._getframe(1),
                optimizer=optimizer, has_closure=bool(args[1:] or kwargs) and _has_closure(args, kwargs),
                backwards_since_step=state.backwards_since_step,
                zero_grads_since_backward=state.zero_grads_since_backward,
            ))
        return None

    def _step_post(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        session = self.session
        if not session.active:
            return None
        state = session.state
        sampled = session.end_step(optimizer)  # step_sampled, then count_step
        state.backwards_since_step = 0
        state.last_progress = "optimizer step"
        state.last_step_end = now = _clock()
        if state.first_step_end is None:
            state.first_step_end = now
        state.step_ends += 1
        log = state.step_log
        if log is not None and len(log.values) < log.limit:  # full: the rows stop, the call too
            log.add(now, state.data_wait_s, session.step, sampled)
        if "step_end" in (session._handlers if sampled else session._every_step) and not (
                self._last_stepped_without_values if self._last_stepped() is optimizer
                else _optimizer_without_values(optimizer)):
            session.emit(ev.StepEnd(step=session.step, sampled=sampled, frame=sys._getframe(1),
                                    optimizer=optimizer,
                                    has_closure=bool(args[1:] or kwargs) and _has_closure(args, kwargs)))
        if session.max_steps is not None and session.step >= session.max_steps:  # should_stop(), inlined
            raise StopRun(f"--max-steps {session.max_steps} reached")
        return None

    # -- patches ---------------------------------------------------------------------------
    def _install_patches(self) -> None:
        self._patch_add_param_group()
        self._patch_train()
        self._patch_zero_grad()
        self._patch_backward()
        self._patch_losses()
        self._patch_dataloader()
        self._patch_schedulers()
        self._patch_state_dict()
        self._patch_save_load()
        self._patch_grad_scaler()

    def _patch_add_param_group(self) -> None:
        """Know every optimizer from its construction (not only once it steps), so a GAN's
        second optimizer is known before its first step."""
        inst = self
        original = torch.optim.Optimizer.add_param_group

        @functools.wraps(original)
        def add_param_group(optimizer, param_group):
            result = original(optimizer, param_group)
            if inst.session.active:
                inst.session.state.optimizers.add(optimizer)
            return result

        self.patcher.patch(torch.optim.Optimizer, "add_param_group", add_param_group)

    def _patch_train(self) -> None:
        inst = self
        original = torch.nn.Module.train

        @functools.wraps(original)
        def train(module, mode: bool = True):
            session = inst.session
            if not session.active or inst._in_train or _dynamo_compiling() or _compiler._is_compiling_flag:
                return original(module, mode)
            inst._in_train += 1
            try:
                result = original(module, mode)
            finally:
                inst._in_train -= 1
                session.state.mode_generation += 1
            if session.wants("mode_change"):
                session.emit(ev.ModeChange(step=session.step, sampled=session.sampled,
                                           frame=sys._getframe(1), module=module, training=bool(mode)))
            return result

        self.patcher.patch(torch.nn.Module, "train", train)

    def _patch_zero_grad(self) -> None:
        inst = self

        def make(original):
            @functools.wraps(original)
            def zero_grad(owner, set_to_none: bool = True, *args, **kwargs):
                session = inst.session
                result = original(owner, set_to_none, *args, **kwargs)
                if session.active:
                    session.state.zero_grads_since_backward += 1
                    step = session.step  # ``session.sampled`` inlined (every step)
                    sampled = step < session.full_window or step % session.sample_every == 0 or session._phase_sampled
                    if "zero_grad" in (session._handlers if sampled else session._every_step):
                        session.emit(ev.ZeroGrad(step=session.step, sampled=sampled,
                                                 frame=sys._getframe(1), owner=owner,
                                                 set_to_none=bool(set_to_none)))
                return result
            return zero_grad

        for owner in (torch.optim.Optimizer, torch.nn.Module):
            original = owner.zero_grad
            self.patcher.patch(owner, "zero_grad", make(original))

    def _patch_backward(self) -> None:
        inst = self
        original_tensor_backward = torch.Tensor.backward
        original_autograd_backward = torch.autograd.backward

        def before(tensor, retain_graph, frame) -> None:
            session = inst.session
            state = session.state
            batches = state.batches_fetched - state.batches_at_last_backward
            index = state.backwards_since_step
            state.backwards_since_step += 1
            state.batches_at_last_backward = state.batches_fetched
            step = session.step  # ``session.sampled`` inlined (every step)
            sampled = step < session.full_window or step % session.sample_every == 0 or session._phase_sampled
            if _without_values(tensor) if type(tensor) is not torch.Tensor else tensor.is_meta:
                return
            state.backwards_with_values += 1  # the step ledger (O103's closure steps read it)
            feed = state.loss_feed  # the loss ledger, while a check follows the training loss
            if feed is not None and (type(tensor) is torch.Tensor or isinstance(tensor, torch.Tensor)) \
                    and (not tensor.ndim or tensor.numel() == 1) and tensor.dtype.is_floating_point:
                feed.record_backward(tensor, session.step, frame)
                if index:
                    # A backward() with no optimizer step since the last one: accumulation, or a
                    # step skipped (a NaN guard, GradScaler). Look at the landed losses now (one
                    # event query): a NaN must be traced while the loop still runs forwards.
                    feed.poll(close=True)
            if "backward" in (session._handlers if sampled else session._every_step):
                session.emit(ev.Backward(step=session.step, sampled=sampled, frame=frame,
                                         tensor=tensor, index_since_step=index,
                                         batches_since_last_backward=batches,
                                         retain_graph=bool(retain_graph)))

        def after(tensor, frame) -> None:
            session = inst.session
            state = session.state
            state.zero_grads_since_backward = 0
            state.backwards_done += 1  # progress, for the stall watchdog
            state.last_progress = "backward"
            # ``session.sampled`` inlined (every step), as in the Module.__call__ wrapper; read
            # anew, not kept from ``before``: a backward hook may step an optimizer.
            step = session.step
            sampled = step < session.full_window or step % session.sample_every == 0 or session._phase_sampled
            if "backward_done" in (session._handlers if sampled else session._every_step) and not (
                    _without_values(tensor) if type(tensor) is not torch.Tensor else tensor.is_meta):
                session.emit(ev.BackwardDone(step=session.step, sampled=sampled,
                                             frame=frame, tensor=tensor))

        @functools.wraps(original_tensor_backward)
        def tensor_backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
            session = inst.session
            if not session.active or inst._in_backward:
                return original_tensor_backward(self, gradient, retain_graph, create_graph, inputs)
            frame = sys._getframe(1)
            try:  # _safe, inlined (every step)
                before(self, retain_graph, frame)
            except StopRun:
                raise
            except Exception as error:  # noqa: BLE001
                session.internal_error("before", error)
            inst._in_backward += 1
            try:
                result = original_tensor_backward(self, gradient, retain_graph, create_graph, inputs)
            finally:
                inst._in_backward -= 1
            try:
                after(self, frame)
            except StopRun:
                raise
            except Exception as error:  # noqa: BLE001
                session.internal_error("after", error)
            return result

        @functools.wraps(original_autograd_backward)
        def autograd_backward(tensors, *args, **kwargs):
            session = inst.session
            if not session.active or inst._in_backward:
                return original_autograd_backward(tensors, *args, **kwargs)
            frame = sys._getframe(1)
            first = tensors if isinstance(tensors, torch.Tensor) else (tensors[0] if tensors else None)
            retain = kwargs.get("retain_graph", args[1] if len(args) > 1 else None)
            inst._safe(before, first, retain, frame)
            inst._in_backward += 1
            try:
                result = original_autograd_backward(tensors, *args, **kwargs)
            finally:
                inst._in_backward -= 1
            inst._safe(after, first, frame)
            return result

        self.patcher.patch(torch.Tensor, "backward", tensor_backward)
        self.patcher.patch(torch.autograd, "backward", autograd_backward)

    def _safe(self, fn, *args) -> None:
        """Run instrumentation code; an internal failure is recorded, never raised."""
        try:
            fn(*args)
        except StopRun:
            raise
        except Exception as error:  # noqa: BLE001
            self.session.internal_error(getattr(fn, "__name__", "hook"), error)

    def _patch_losses(self) -> None:
        inst = self
        for name in LOSS_FUNCTIONS:
            original = getattr(F, name, None)
            if original is None:
                continue
            self.patcher.patch(F, name, _make_loss_wrapper(inst, name, original))

    def _patch_dataloader(self) -> None:
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        inst = self
        original_iter = DataLoader.__iter__
        original_next = _BaseDataLoaderIter.__next__

        @functools.wraps(original_iter)
        def loader_iter(loader):
            iterator = original_iter(loader)
            session = inst.session
            if session.active:
                inst._safe(inst._epoch_start, loader, iterator)
            return iterator

        @functools.wraps(original_next)
        def loader_next(iterator):
            session = inst.session
            if not session.active:
                return original_next(iterator)
            started = _clock()
            batch = original_next(iterator)
            waited = _clock() - started
            try:  # _safe, inlined (every batch)
                inst._batch_fetched(iterator, batch, waited)
            except StopRun:
                raise
            except Exception as error:  # noqa: BLE001
                session.internal_error("batch fetched", error)
            return batch

        self.patcher.patch(DataLoader, "__iter__", loader_iter)
        self.patcher.patch(_BaseDataLoaderIter, "__next__", loader_next)

    def _epoch_start(self, loader: Any, iterator: Any) -> None:
        session = self.session
        epoch = self._epochs.get(loader, -1) + 1
        self._epochs[loader] = epoch
        try:
            length = len(loader)
        except TypeError:
            length = None
        session.state.loader_lengths[loader] = length
        tally = self._tallies.get(loader)
        if tally is None:
            tally = self._tallies[loader] = LoaderTally()
        self._iterators[iterator] = {"loader": weakref.ref(loader), "index": 0, "epoch": epoch,
                                     "length": length, "tally": tally}
        if session.wants("epoch_start"):
            session.emit(ev.EpochStart(step=session.step, sampled=session.sampled,
                                       frame=sys._getframe(1), loader=loader, length=length,
                                       epoch=epoch, tally=tally))

    def _batch_fetched(self, iterator: Any, batch: Any, waited: float) -> None:
        session = self.session
        state = session.state
        state.batches_fetched += 1
        state.last_progress = "batch"
        info: dict[str, Any] | None
        if self._last_iterator() is iterator:  # the usual batch: the same pass as the last one
            info = self._last_info
        else:
            info = self._iterators.get(iterator)
            if info is None:
                return
            self._last_iterator, self._last_info = weakref.ref(iterator), info
        index = info["index"]
        info["index"] = index + 1
        state.data_wait_s += waited
        tally = info["tally"]
        tally.wait += waited
        tally.batches += 1
        step = session.step  # ``session.sampled`` inlined (every batch)
        sampled = step < session.full_window or step % session.sample_every == 0 or session._phase_sampled
        if "batch" in (session._handlers if sampled else session._every_step):
            session.emit(ev.BatchFetched(step=session.step, sampled=sampled,
                                         frame=sys._getframe(1), loader=info["loader"](),
                                         batch=batch, index=index, epoch=info["epoch"],
                                         length=info["length"], wait_s=waited))

    def _patch_schedulers(self) -> None:
        from torch.optim import lr_scheduler

        inst = self
        classes = [lr_scheduler.LRScheduler] + [
            cls for cls in vars(lr_scheduler).values()
            if isinstance(cls, type) and issubclass(cls, lr_scheduler.LRScheduler)
            and cls is not lr_scheduler.LRScheduler and "step" in cls.__dict__
        ]
        for cls in classes:
            original = cls.step
            self.patcher.patch(cls, "step", _make_scheduler_wrapper(inst, original))

    def _patch_state_dict(self) -> None:
        inst = self
        original = torch.nn.Module.load_state_dict

        @functools.wraps(original)
        def load_state_dict(module, state_dict, strict: bool = True, assign: bool = False):
            result = original(module, state_dict, strict, assign)
            session = inst.session
            if session.active and session.wants("state_dict_load"):
                def emit():
                    session.emit(ev.StateDictLoad(
                        step=session.step, sampled=session.sampled, frame=sys._getframe(1),
                        module=module, keys=list(state_dict.keys()), strict=bool(strict),
                        missing=list(result.missing_keys), unexpected=list(result.unexpected_keys),
                        model_keys=list(module.state_dict().keys()),
                    ))
                inst._safe(emit)
            return result

        self.patcher.patch(torch.nn.Module, "load_state_dict", load_state_dict)

    def _patch_save_load(self) -> None:
        inst = self
        original_save = torch.save
        original_load = torch.load

        @functools.wraps(original_save)
        def save(obj, f, *args, **kwargs):
            session = inst.session
            if not session.active:
                return original_save(obj, f, *args, **kwargs)
            started = time.perf_counter()
            result = original_save(obj, f, *args, **kwargs)
            seconds = time.perf_counter() - started
            if session.wants("checkpoint_save"):
                frame = sys._getframe(1)
                inst._safe(lambda: session.emit(ev.CheckpointSave(
                    step=session.step, sampled=session.sampled, frame=frame, obj=obj,
                    path=_path_of(f), seconds=seconds)))
            return result

        @functools.wraps(original_load)
        def load(f, *args, **kwargs):
            session = inst.session
            if not session.active:
                return original_load(f, *args, **kwargs)
            started = time.perf_counter()
            result = original_load(f, *args, **kwargs)
            seconds = time.perf_counter() - started
            if session.wants("checkpoint_load"):
                weights_only = kwargs.get("weights_only")
                frame = sys._getframe(1)
                inst._safe(lambda: session.emit(ev.CheckpointLoad(
                    step=session.step, sampled=session.sampled, frame=frame, path=_path_of(f),
                    weights_only=weights_only, seconds=seconds)))
            return result

        self.patcher.patch(torch, "save", save)
        self.patcher.patch(torch, "load", load)

    def _patch_grad_scaler(self) -> None:
        try:
            from torch.amp.grad_scaler import GradScaler
        except ImportError:  # pragma: no cover - very old torch
            return
        inst = self
        original = GradScaler.scale

        @functools.wraps(original)
        def scale(scaler, outputs):
            if inst.session.active:
                inst.session.state.scaler = weakref.ref(scaler)
            return original(scaler, outputs)

        self.patcher.patch(GradScaler, "scale", scale)


class _Nothing:
    pass


_dead_ref: weakref.ref[Any] = weakref.ref(_Nothing())  # a weak reference whose object is gone


def _not_a_compiled_frame(function: Any, *, callees: bool = True) -> None:
    """``torch.compile(model)`` compiles the first frame it enters below ``model.__call__``
    that is not torch's own: with ``Module.__call__`` wrapped, that would be the wrapper, and
    dynamo's records (recompilations, graph breaks) would name nndoctor instead of the user's
    ``forward``. Dynamo skips this code object as a frame; with ``callees`` the frames it calls
    (the user's ``forward``) are compiled as before, without, they are skipped too (nndoctor's
    own handlers: compiled, they fail inside dynamo — a dataclass event built while tracing a
    compiled model — and cost compile time for nothing). Where dynamo inlines the wrapper, the
    wrapper steps aside (``_dynamo_compiling``)."""
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )

        below = _FrameAction.DEFAULT if callees else _FrameAction.SKIP
        set_code_exec_strategy(function.__code__, _FrameExecStrategy(_FrameAction.SKIP, below))
    except Exception:  # noqa: BLE001 - a torch without this API compiles the wrapper's frame: still correct
        pass


def _without_values(value: Any) -> bool:
    """Meta or fake tensors (shape inference, ``torch.device("meta")`` models) carry no values:
    no event is emitted about them, so no check reads data that does not exist. (The hooks of
    every step ask ``type(x) is torch.Tensor and x.is_meta`` first: a FakeTensor is a subclass.)"""
    if isinstance(value, torch.Tensor):
        return value.is_meta or type(value).__name__ == "FakeTensor"
    from nndoctor.instrument.stats import first_tensor

    tensor = first_tensor(value)
    if tensor is None:
        return False
    return tensor.is_meta or type(tensor).__name__ == "FakeTensor"


def _optimizer_without_values(optimizer: Any) -> bool:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return _without_values(p)
    return False


def _has_closure(args: tuple, kwargs: dict) -> bool:
    """Was ``step`` given a closure (L-BFGS)? torch's step hooks get ``args`` *with* the
    optimizer itself first, so a positional closure is ``args[1]``. The hooks ask only when
    there is more than the optimizer (``args[1:] or kwargs``, no calls): the usual step."""
    if len(args) > 1 and callable(args[1]):
        return True
    return bool(kwargs) and callable(kwargs.get("closure"))


def _path_of(f: Any) -> str | None:
    if isinstance(f, (str, bytes)) or hasattr(f, "__fspath__"):
        return str(f)
    return getattr(f, "name", None) if isinstance(getattr(f, "name", None), str) else None


# Per torch loss module class: its functional name, and which of ``_LOSS_OPTION_NAMES`` its
# instances have (torch's losses set them all in ``__init__``): looked up with hasattr once per
# class, not six times on every step. A user's loss class may set them conditionally: asked
# each time.
_LOSS_MODULE_KINDS: dict[type, tuple[str, tuple[str, ...]]] = {}


def _loss_module_options(module: Any) -> tuple[str, dict[str, Any]]:
    """The functional name of a loss module and its options (``reduction``, ``ignore_index`` …)."""
    cls = type(module)
    kind = _LOSS_MODULE_KINDS.get(cls)
    if kind is None:
        kind = (_LOSS_MODULE_FUNCTION.get(cls.__name__, cls.__name__),
                tuple(k for k in _LOSS_OPTION_NAMES if hasattr(module, k)))
        if cls.__module__ == "torch.nn.modules.loss":
            _LOSS_MODULE_KINDS[cls] = kind
    # A loop over the instance's __dict__ (torch's losses keep these options there, ``weight``
    # aside: a buffer), no comprehension and no getattr per option: asked on every step. Only
    # for torch's own classes: a user's class may define an option as a property.
    options: dict[str, Any] = {}
    if cls in _LOSS_MODULE_KINDS:
        attributes = module.__dict__
        for k in kind[1]:
            options[k] = attributes[k] if k in attributes else getattr(module, k)
    else:
        for k in kind[1]:
            options[k] = getattr(module, k)
    return kind[0], options


def _make_loss_wrapper(inst: Installation, name: str, original: Any) -> Any:
    @functools.wraps(original)
    def loss_function(input, target, *args, **kwargs):
        session = inst.session
        if not session.active or inst._in_loss or _dynamo_compiling() or _compiler._is_compiling_flag:
            return original(input, target, *args, **kwargs)
        output = original(input, target, *args, **kwargs)
        step = session.step  # ``session.sampled`` inlined (every step)
        sampled = step < session.full_window or step % session.sample_every == 0 or session._phase_sampled
        route = "loss" if sampled or not torch.is_grad_enabled() else TRAINING_LOSS
        if route in (session._handlers if sampled else session._every_step) and not (
                _without_values(output) if type(output) is not torch.Tensor else output.is_meta):
            options = {k: v for k, v in kwargs.items() if k in _LOSS_OPTION_NAMES}
            frame = sys._getframe(1)
            inst._safe(lambda: session.emit(ev.LossComputed(
                step=session.step, sampled=sampled, frame=frame, function=name,
                input=input, target=target, output=output, options=options), route))
        return output

    return loss_function


def _make_scheduler_wrapper(inst: Installation, original: Any) -> Any:
    @functools.wraps(original)
    def step(scheduler, *args, **kwargs):
        session = inst.session
        # Composite schedulers (SequentialLR, ChainedScheduler) step their children: only the
        # outermost call is an event. The depth lives on the installation, not on the user's
        # scheduler, whose __dict__ is its state_dict.
        if not session.active or inst._in_scheduler:
            return original(scheduler, *args, **kwargs)
        initial = getattr(scheduler, "_step_count", 1) == 0
        optimizer = getattr(scheduler, "optimizer", None)
        lr_before = [g.get("lr") for g in optimizer.param_groups] if optimizer is not None else []
        inst._in_scheduler += 1
        try:
            result = original(scheduler, *args, **kwargs)
        finally:
            inst._in_scheduler -= 1
        if session.wants("scheduler_step"):
            lr_after = [g.get("lr") for g in optimizer.param_groups] if optimizer is not None else []
            frame = sys._getframe(1)
            inst._safe(lambda: session.emit(ev.SchedulerStep(
                step=session.step, sampled=session.sampled, frame=frame, scheduler=scheduler,
                initial=initial, lr_before=lr_before, lr_after=lr_after)))
        return result

    return step


def install(session: Session, features: Sequence[Feature] = ()) -> Installation:
    """The hook layer alone, then ``features``; ``instrument.extensions.install`` installs a
    whole run (the hooks and every feature)."""
    return Installation(session, features).install()
