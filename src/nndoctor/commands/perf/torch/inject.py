"""Changes ``--try`` injects into the user's own training loop, unchanged script and all.

Each change is applied where the user's code meets torch, the first time it is seen: a
model's first training forward (autocast around its forward, channels_last for it and its
4-D inputs, its ``forward`` compiled in place, ``mode="reduce-overhead"`` for CUDA graphs, the
modules whose hand-written attention that forward ran compiled with the SDPA rewrite of
``sdpa.py``), the first ``optimizer.step()`` (fused kernels, before any optimizer state
exists), the construction of batch samplers (``batch-size=K``: every ``BatchSampler``, the
one a ``DataLoader(batch_size=…)`` builds included, draws K times as many samples), or
process-wide flags at start (TF32, cuDNN autotuning), or the ``DistributedDataParallel(...)``
call (DDP's settings, ``perf/torch/ddp_trials.py``).
Nothing about the step's shape is assumed — dict or tuple batches, reshapes and casts
between model and loss, losses computed inside the model, several models and optimizers —
because the user's loop runs as written.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

# Changes that act on the step (as opposed to ``loader``), in the order they are tried.
STEP_CHANGES = ("amp", "channels_last", "compile", "cudnn-benchmark", "tf32", "fused-optimizer", "sdpa",
                "cuda-graphs", "batch-size")
FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")


def autocast_dtype(device_type: str) -> Any:
    import torch

    if device_type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def _to_channels_last(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
        return value.contiguous(memory_format=torch.channels_last)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_channels_last(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_channels_last(v) for k, v in value.items()}
    return value


def _device_type(module: Any) -> str:
    for parameter in module.parameters():
        return parameter.device.type
    return "cpu"


class ChangeInjector:
    """Internal subscriber of a ``--try`` re-run (an event subscriber, not a catalog check)."""

    subscriber_name = "perf --try change injector"

    def __init__(self, session: Any, changes: Iterable[str] = ()) -> None:
        self.session = session
        self.changes = frozenset(changes)
        self._models: set[int] = set()
        self._optimizers: set[int] = set()
        self.applied: list[str] = []
        self.notes: list[str] = []  # why a requested change was not applied somewhere
        self._undo: list[Any] = []
        self._tracer: Any = None
        import torch

        if "tf32" in self.changes:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            self.applied.append("tf32")
        if "cudnn-benchmark" in self.changes:
            torch.backends.cudnn.benchmark = True
            self.applied.append("cudnn-benchmark")
        factor = batch_factor(self.changes)
        if factor:
            self._scale_batch_samplers(factor)
        self._ddp: Any = None
        if any(change.startswith("ddp-") for change in self.changes):
            from nndoctor.commands.perf.torch.ddp_trials import DdpInjection

            self._ddp = DdpInjection(self.changes, self.applied, self.notes)
            self._undo.append(self._ddp.undo)
        if "sdpa" in self.changes:
            from nndoctor.commands.perf.torch.sdpa import AttentionTracer

            self._tracer = AttentionTracer()
            self._arm_tracer()

    def on_forward(self, event: Any) -> None:
        module = event.module
        if event.is_loss or not event.grad_enabled or not event.training or id(module) in self._models:
            return
        self._models.add(id(module))
        compiled = False
        if self._tracer is not None and self._tracer.started and not self._tracer.stopped:
            compiled = self._apply_sdpa(module)
        if "channels_last" in self.changes:
            import torch

            module.to(memory_format=torch.channels_last)
            self._wrap_forward(module, lambda forward: _channels_last_inputs(forward))
            self.applied.append(f"channels_last on {type(module).__name__}")
        if "amp" in self.changes:
            device_type = _device_type(module)
            self._wrap_forward(module, lambda forward: _autocast(forward, device_type))
            self.applied.append(f"autocast({autocast_dtype(device_type)}) on {type(module).__name__}")
        if compiled:
            return  # sdpa with compile / cuda-graphs: one compilation did both (_apply_sdpa)
        if "cuda-graphs" in self.changes:
            # torch.compile's CUDA graphs: one graph replay instead of a launch per kernel.
            _compile_forward(module, "reduce-overhead")
            self.applied.append(f"compile(mode='reduce-overhead') on {type(module).__name__}")
        elif "compile" in self.changes:  # reduce-overhead is torch.compile too: one compile
            _compile_forward(module, None)
            self.applied.append(f"compile on {type(module).__name__}")

    def on_step_start(self, event: Any) -> None:
        optimizer = event.optimizer
        while hasattr(optimizer, "optimizer") and not hasattr(optimizer, "param_groups"):
            optimizer = optimizer.optimizer
        if "fused-optimizer" not in self.changes or id(optimizer) in self._optimizers:
            return
        self._optimizers.add(id(optimizer))
        if type(optimizer).__name__ not in FUSED_OPTIMIZERS or optimizer.state:
            return
        for group in optimizer.param_groups:
            group["fused"] = True
            group["foreach"] = False
        self.applied.append(f"fused=True on {type(optimizer).__name__}")

    def on_step_end(self, event: Any) -> None:
        if self._ddp is not None:
            self._ddp.step_ended()

    def on_run_end(self, event: Any) -> None:
        if self._tracer is not None:
            self._tracer.stop()
        while self._undo:
            self._undo.pop()()

    @staticmethod
    def _wrap_forward(module: Any, wrap: Any) -> None:
        module.forward = wrap(module.forward)

    # -- sdpa ------------------------------------------------------------------------------
    def _arm_tracer(self) -> None:
        """Record the torch calls of the first training forward from its start: a global
        pre-hook starts the tracer at the first top-level module call with grad enabled."""
        import torch
        from torch.nn.modules import module as module_mod

        def first_call(module: Any, args: Any) -> None:
            if self._tracer.started or not (module.training and torch.is_grad_enabled()):
                return
            handle.remove()
            self._tracer.start(module)

        handle = module_mod.register_module_forward_pre_hook(first_call)
        self._undo.append(handle.remove)

    def _apply_sdpa(self, root: Any) -> bool:
        """Replace the hand-written attention the traced forward ran. With compile or
        cuda-graphs also asked for, the root's forward is compiled once by a backend that
        rewrites the attention and hands the graph to Inductor (True: the root is compiled);
        a module compiled inside an outer torch.compile would be inlined, its rewrite lost."""
        import torch

        from nndoctor.commands.perf.torch.sdpa import SdpaRewriter

        self._tracer.stop()
        names = {id(m): n for n, m in root.named_modules()}
        found = [m for m in self._tracer.modules if id(m) in names]
        if not found:
            self.notes.append("no hand-written attention (softmax(Q Kᵀ) V) in the training forward")
            return False
        then = "reduce-overhead" if "cuda-graphs" in self.changes else "inductor" if "compile" in self.changes else None
        if then is not None:
            where = f"{type(root).__name__} ({len(found)} attention module(s))"
            root.forward = torch.compile(root.forward, backend=SdpaRewriter(where, self.applied, self.notes, then))
            self.applied.append(f"compile{'(mode=' + repr(then) + ')' if then == 'reduce-overhead' else ''} on "
                                f"{type(root).__name__}")
            return True
        for module in found:
            where = f"{names[id(module)] or 'the model'} ({type(module).__name__})"
            module.compile(backend=SdpaRewriter(where, self.applied, self.notes))
        return False

    # -- batch-size ------------------------------------------------------------------------
    def _scale_batch_samplers(self, factor: int) -> None:
        from torch.utils.data import BatchSampler

        original = BatchSampler.__init__
        applied = self.applied

        @functools.wraps(original)
        def scaled_init(sampler_self: Any, sampler: Any, batch_size: int, drop_last: bool, *args: Any,
                        **kwargs: Any) -> None:
            entry = f"batch_size {batch_size} → {batch_size * factor}"
            if entry not in applied:  # a loader rebuilt every epoch builds a sampler every epoch
                applied.append(entry)
            original(sampler_self, sampler, batch_size * factor, drop_last, *args, **kwargs)

        setattr(BatchSampler, "__init__", scaled_init)  # noqa: B010 - patching a method: mypy rejects the assignment
        self._undo.append(lambda: setattr(BatchSampler, "__init__", original))


def batch_factor(changes: Any) -> int | None:
    """K of a ``batch-size=K`` change (the re-run's name for "K times the batch")."""
    for change in changes:
        if change.startswith("batch-size="):
            return int(change.split("=", 1)[1])
    return None


def _autocast(forward: Any, device_type: str) -> Any:
    import torch

    dtype = autocast_dtype(device_type)

    @functools.wraps(forward)
    def forward_in_autocast(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=dtype):
            return forward(*args, **kwargs)

    return forward_in_autocast


def _compile_forward(module: Any, mode: str | None) -> None:
    """Compile the module as ``torch.compile(model)`` runs it: its ``forward``, in place (the
    user's variable keeps pointing at this module), with the module-call hooks around it run
    eagerly. ``module.compile()`` instead compiles the whole call, nndoctor's global forward
    hooks included; on a 2 ms step (a small MLP at batch 256 on an H100) CUDA graphs
    injected that way ran at 0.79× of this, and gained nothing over eager, where the script's
    own ``torch.compile(model, mode="reduce-overhead")`` gained 1.16×."""
    import torch

    module.forward = torch.compile(module.forward, mode=mode)


def _channels_last_inputs(forward: Any) -> Any:
    @functools.wraps(forward)
    def forward_channels_last(*args: Any, **kwargs: Any) -> Any:
        return forward(*_to_channels_last(args), **_to_channels_last(kwargs))

    return forward_channels_last
