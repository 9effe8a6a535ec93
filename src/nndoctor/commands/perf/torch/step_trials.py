"""The user's training step, replayed on copies for the trials: what was captured of it
(``CapturedStep``), one step of it with a change applied (``StepRunner``), and the loss."""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable
from typing import Any


class CapturedStep:
    """What the end-to-end loader trial needs of the user's step: the model, optimizer and
    loss (copied, never stepped themselves) and the batch captured on the last measured
    step (its shapes say which tensors of a loader batch the model and the loss take)."""

    def __init__(self, model: Any, optimizer: Any, loss_fn: Callable, inputs: tuple, target: Any,
                 device: str) -> None:
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.inputs, self.target, self.device = inputs, target, device


def _to_channels_last(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
        return value.contiguous(memory_format=torch.channels_last)
    if isinstance(value, tuple):
        return tuple(_to_channels_last(v) for v in value)
    if isinstance(value, list):
        return [_to_channels_last(v) for v in value]
    return value


def _settings(optimizer: Any, **overrides: Any) -> dict[str, Any]:
    """The optimizer's defaults its class takes back as keyword arguments: a subclass may keep
    defaults its own constructor does not accept (torch's AdamW keeps Adam's
    ``decoupled_weight_decay``, which ``AdamW(...)`` refuses)."""
    settings = {**optimizer.defaults, **overrides}
    try:
        accepted = inspect.signature(type(optimizer).__init__).parameters
    except (TypeError, ValueError):
        return settings
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return settings
    return {key: value for key, value in settings.items() if key in accepted or key in overrides}


def copied_groups(optimizer: Any, model: Any, params: list[Any], **overrides: Any) -> list[Any]:
    """The user's parameter groups (weight decay off for norms and biases, per-group learning
    rates) over the copy's ``params`` (``model.parameters()``'s order), each with ``overrides``;
    parameters outside the model are left out. Plain ``params`` when no group maps onto them."""
    position = {id(p): i for i, p in enumerate(model.parameters())}
    groups = []
    for group in getattr(optimizer, "param_groups", None) or []:
        mapped = [params[position[id(p)]] for p in group.get("params", []) if id(p) in position]
        if mapped:
            groups.append({**{k: v for k, v in group.items() if k != "params"}, **overrides, "params": mapped})
    return groups or params


def _new_optimizer(optimizer: Any, params: list[Any], model: Any = None) -> Any:
    import torch

    try:
        groups = copied_groups(optimizer, model, params) if model is not None else params
        return type(optimizer)(groups, **_settings(optimizer))
    except Exception:  # noqa: BLE001 - an exotic optimizer: time plain SGD's update instead
        return torch.optim.SGD(params, lr=optimizer.param_groups[0].get("lr", 1e-3))


def fused_optimizer(optimizer: Any, params: list[Any], model: Any = None) -> Any:
    """A copy of the user's optimizer class, settings and groups with ``fused=True``: raises when
    the class or the device has no fused kernels (never a stand-in: that would time another update)."""
    while hasattr(optimizer, "optimizer") and not hasattr(optimizer, "defaults"):
        optimizer = optimizer.optimizer  # a wrapper (AMP scaler shims), as the re-run's injection unwraps
    fused = {"fused": True, "foreach": False}
    groups = copied_groups(optimizer, model, params, **fused) if model is not None else params
    return type(optimizer)(groups, **_settings(optimizer, **fused))


class StepRunner:
    """One variant of the user's step on its own copy of the model and optimizer."""

    def __init__(self, variant: str, model: Any, optimizer: Any, loss_fn: Callable, inputs: tuple,
                 target: Any, device: str) -> None:
        import torch

        self.variant, self.device, self.loss_fn, self.target = variant, device, loss_fn, target
        # A variant may combine changes: "amp+channels_last".
        self.parts = frozenset(variant.split("+"))
        self.model = copy.deepcopy(model)
        self.inputs = inputs
        if "channels_last" in self.parts:
            self.model = self.model.to(memory_format=torch.channels_last)
            self.inputs = _to_channels_last(inputs)
        if "fused-optimizer" in self.parts:
            self.optimizer = fused_optimizer(optimizer, list(self.model.parameters()), model)
        else:
            self.optimizer = _new_optimizer(optimizer, list(self.model.parameters()), model)
        self.forward = self.model
        if "compile" in self.parts:
            # In place on our copy: an OptimizedModule wrapper would add a second module call
            # (the wrapper's, then the model's) to every forward the engine observes.
            self.model.compile()

    @contextlib.contextmanager
    def context(self):
        import torch

        saved = torch.backends.cudnn.benchmark
        saved_tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.benchmark = True if "cudnn-benchmark" in self.parts else saved
        if "tf32" in self.parts:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            if "amp" in self.parts:
                with torch.autocast(device_type=self.device, dtype=torch.bfloat16):
                    yield
            else:
                yield
        finally:
            torch.backends.cudnn.benchmark = saved
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved_tf32

    def loss(self) -> Any:
        with self.context():
            output = self.forward(*self.inputs)
            return self.loss_fn(output, self.target)

    def step(self) -> None:
        loss = self.loss()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def run(self, inputs: tuple, target: Any) -> None:
        """One step on another batch (the end-to-end loader trial's), in the variant's memory
        format as its captured batch is (the advised loop converts each batch it loads)."""
        if "channels_last" in self.parts:
            inputs = _to_channels_last(inputs)
        with self.context():
            loss = self.loss_fn(self.forward(*inputs), target)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def loss_callable(recorder: Any) -> Callable | None:
    """The user's loss as a callable on (output, target), from the recorded loss events."""
    import torch.nn.functional as F

    if recorder.loss_module_ref is not None:
        module = recorder.loss_module_ref()
        return copy.deepcopy(module) if module is not None else None
    if recorder.loss_function and hasattr(F, recorder.loss_function):
        function, options = getattr(F, recorder.loss_function), dict(recorder.loss_options)
        return lambda output, target: function(output, target, **options)
    return None
