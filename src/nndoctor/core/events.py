"""Event types: what the instrumentation layer tells the checks about a training run.

Events are short-lived. They may hold the user's objects (modules, tensors, optimizers)
while they are being dispatched; a check must copy what it needs (numbers, names, a
``Location``, weak references) and never keep the event itself, or the user's tensors
would outlive their step (observer rule: no retained references).

``step`` is the number of optimizer steps completed so far (the largest count over all
optimizers, so a GAN with two optimizers advances one step per iteration). ``sampled``
says whether this step is fully instrumented (the first window of steps, then one in
every few); heavy statistics are only computed on sampled steps.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, ClassVar

from nndoctor.core.findings import Location
from nndoctor.core.user_code import user_location


@dataclass(eq=False)
class Event:
    kind: ClassVar[str] = "event"

    step: int = 0
    sampled: bool = False
    # The frame that produced the event; resolved lazily to the user's code location.
    frame: FrameType | None = field(default=None, repr=False)
    _location: Location | None = field(default=None, repr=False)
    _resolved: bool = field(default=False, repr=False)
    # Statistics computed once per event and shared by every check that asks.
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def location(self) -> Location | None:
        """The first frame of the user's code (outside torch, nndoctor and the stdlib)."""
        if not self._resolved:
            self._location = user_location(self.frame)
            self._resolved = True
        return self._location

    def release(self) -> None:
        """Drop every reference to the user's objects once dispatch is over: every field that
        may hold one (typed other than a plain number, string or bool) is set to None — two
        dictionary writes whatever the fields (every event of the hot path pays this)."""
        self.frame = None
        if self.cache:
            self.cache.clear()
        try:
            nones = RELEASED[type(self)]
        except KeyError:  # once per event class
            nones = released_nones(type(self))
        self.__dict__.update(nones)  # plain dataclasses: no setattr per field


_KEEP = {"step", "sampled", "_location", "_resolved", "cache", "frame"}
# Per event class: the fields ``release`` sets to None (``Session.emit`` does it inline).
RELEASED: dict[type, dict[str, None]] = {}
# Fields declared as these hold no user object: release() leaves them.
_PLAIN_ANNOTATIONS = {"bool", "int", "float", "str", "bool | None", "int | None", "float | None", "str | None"}


def released_nones(cls: type) -> dict[str, None]:
    """The fields of an event class that may hold a user's object, each mapped to None
    (computed once per class, kept in ``RELEASED``)."""
    # dataclasses.fields: the instance fields (``__dataclass_fields__`` lists the ClassVars too)
    nones = RELEASED[cls] = dict.fromkeys(
        f.name for f in dataclasses.fields(cls) if f.name not in _KEEP and str(f.type) not in _PLAIN_ANNOTATIONS)
    return nones


def caller_frame(depth: int = 2) -> FrameType | None:
    try:
        return sys._getframe(depth)
    except ValueError:
        return None


@dataclass(eq=False)
class ModeChange(Event):
    """``module.train(mode)`` / ``module.eval()`` was called (outermost call only)."""

    kind: ClassVar[str] = "mode_change"
    module: Any = None
    training: bool = True


@dataclass(eq=False)
class Forward(Event):
    """A top-level module call finished (a model, or a loss module, called from user code)."""

    kind: ClassVar[str] = "forward"
    module: Any = None
    inputs: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    output: Any = None
    training: bool = True
    grad_enabled: bool = True
    inference_mode: bool = False
    is_loss: bool = False


@dataclass(eq=False)
class ModuleOutput(Event):
    """A submodule's forward finished, on a sampled step (activation statistics)."""

    kind: ClassVar[str] = "module_output"
    module: Any = None
    qualname: str = ""
    root: Any = None
    inputs: tuple[Any, ...] = ()
    output: Any = None


@dataclass(eq=False)
class LossComputed(Event):
    """A loss function or loss module produced a value.

    ``function`` is the torch.nn.functional name (``cross_entropy``, ``nll_loss`` …);
    ``options`` holds keyword arguments such as ``reduction`` and ``ignore_index``.
    """

    kind: ClassVar[str] = "loss"
    function: str = ""
    module: Any = None
    input: Any = None
    target: Any = None
    output: Any = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Backward(Event):
    """``tensor.backward()`` / ``torch.autograd.backward`` is about to run."""

    kind: ClassVar[str] = "backward"
    tensor: Any = None
    index_since_step: int = 0  # 0 for the first backward after an optimizer step
    batches_since_last_backward: int = 0
    retain_graph: bool = False


@dataclass(eq=False)
class BackwardDone(Event):
    """The backward pass finished; gradients are in ``.grad``."""

    kind: ClassVar[str] = "backward_done"
    tensor: Any = None


@dataclass(eq=False)
class StepStart(Event):
    """``optimizer.step()`` is about to run (gradients present, weights not yet updated)."""

    kind: ClassVar[str] = "step_start"
    optimizer: Any = None
    has_closure: bool = False
    backwards_since_step: int = 0
    zero_grads_since_backward: int = 0


@dataclass(eq=False)
class StepEnd(Event):
    """``optimizer.step()`` returned; ``step`` already counts it."""

    kind: ClassVar[str] = "step_end"
    optimizer: Any = None
    has_closure: bool = False


@dataclass(eq=False)
class ManualStep(Event):
    """A loop without torch.optim updated ``module``'s parameters by hand (``p -= lr * p.grad``
    under ``no_grad``, ``p.data.add_(-lr * p.grad)``): the step boundary of such a loop.

    Recognised at the next top-level forward with gradients after a ``backward()``
    (``instrument/manual_steps.py``): the update has already run, no backward since, and
    ``step`` already counts it. The parameters' ``_version`` counters and values tell a
    check whether this transition really wrote them (a later gradient-only pass, such as a
    saliency map, also goes forward after backward).
    """

    kind: ClassVar[str] = "manual_step"
    module: Any = None


@dataclass(eq=False)
class ZeroGrad(Event):
    """``optimizer.zero_grad()`` or ``module.zero_grad()``."""

    kind: ClassVar[str] = "zero_grad"
    owner: Any = None
    set_to_none: bool = True


@dataclass(eq=False)
class EpochStart(Event):
    """A DataLoader started a new pass (``iter(loader)``)."""

    kind: ClassVar[str] = "epoch_start"
    loader: Any = None
    length: int | None = None
    epoch: int = 0
    tally: Any = None  # the loader's LoaderTally (nndoctor.core.step_log): batches and waits, all passes


@dataclass(eq=False)
class BatchFetched(Event):
    """A DataLoader yielded a batch. ``wait_s`` is how long the loop waited for it."""

    kind: ClassVar[str] = "batch"
    loader: Any = None
    batch: Any = None
    index: int = 0  # position within the current pass
    epoch: int = 0
    length: int | None = None
    wait_s: float = 0.0


@dataclass(eq=False)
class SchedulerStep(Event):
    """``scheduler.step()``; ``initial`` is the call the constructor makes itself."""

    kind: ClassVar[str] = "scheduler_step"
    scheduler: Any = None
    initial: bool = False
    lr_before: list[Any] = field(default_factory=list)  # floats, or tensors (tensor lr)
    lr_after: list[Any] = field(default_factory=list)


@dataclass(eq=False)
class StateDictLoad(Event):
    """``module.load_state_dict(...)`` returned (or raised)."""

    kind: ClassVar[str] = "state_dict_load"
    module: Any = None
    keys: list[str] = field(default_factory=list)
    strict: bool = True
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    model_keys: list[str] = field(default_factory=list)


@dataclass(eq=False)
class CheckpointSave(Event):
    """``torch.save(obj, f)`` returned; ``seconds`` is the time it took."""

    kind: ClassVar[str] = "checkpoint_save"
    obj: Any = None
    path: str | None = None
    seconds: float = 0.0


@dataclass(eq=False)
class CheckpointLoad(Event):
    """``torch.load(f, ...)`` was called."""

    kind: ClassVar[str] = "checkpoint_load"
    path: str | None = None
    weights_only: bool | None = None
    seconds: float = 0.0


@dataclass(eq=False)
class Crash(Event):
    """The user's script raised. ``context`` holds what the engine knew at that moment."""

    kind: ClassVar[str] = "crash"
    exception: BaseException | None = None
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class RunEnd(Event):
    """The run is over; ``status`` is completed, stopped, crashed or interrupted."""

    kind: ClassVar[str] = "run_end"
    status: str = "completed"
    wall_s: float = 0.0


ALL_EVENTS: tuple[type[Event], ...] = (
    ModeChange,
    Forward,
    ModuleOutput,
    LossComputed,
    Backward,
    BackwardDone,
    StepStart,
    StepEnd,
    ManualStep,
    ZeroGrad,
    EpochStart,
    BatchFetched,
    SchedulerStep,
    StateDictLoad,
    CheckpointSave,
    CheckpointLoad,
    Crash,
    RunEnd,
)

EVENT_KINDS: dict[str, type[Event]] = {cls.kind: cls for cls in ALL_EVENTS}


# -- events of the training-practice probes (instrument/training_probe.py) ------------------------
@dataclass(eq=False)
class GradClip(Event):
    """``clip_grad_norm_`` / ``clip_grad_value_`` returned.

    ``scaled`` is True when a GradScaler had scaled the loss of this step and had not yet
    unscaled the clipped gradients' optimizer (``scaler.unscale_(optimizer)``): the clipped
    gradients were still multiplied by the scale.
    """

    kind: ClassVar[str] = "grad_clip"
    function: str = ""
    limit: float | None = None  # max_norm or clip_value
    total_norm: Any = None  # what clip_grad_norm_ returned (a tensor; read only when needed)
    scaled: bool = False
    scaler: Any = None


@dataclass(eq=False)
class ScalerStep(Event):
    """``GradScaler.step(optimizer)`` returned; ``skipped`` when it did not step the optimizer
    (the gradients held Inf/NaN)."""

    kind: ClassVar[str] = "scaler_step"
    scaler: Any = None
    optimizer: Any = None
    skipped: bool = False


@dataclass(eq=False)
class ActivationCheckpoint(Event):
    """``torch.utils.checkpoint.checkpoint(function, *args, ...)`` was called."""

    kind: ClassVar[str] = "activation_checkpoint"
    function: Any = None
    use_reentrant: bool | None = None  # None: not passed (torch then defaults to True)
    grad_enabled: bool = True
    inputs_require_grad: bool = False
    trainable_parameters: int = 0  # trainable parameters of the checkpointed module(s)
    function_name: str = ""


@dataclass(eq=False)
class DebugModeSet(Event):
    """A debugging mode was switched on or off from user code (``set_detect_anomaly(True)``,
    ``detect_anomaly()``)."""

    kind: ClassVar[str] = "debug_mode"
    mode: str = ""
    enabled: bool = True
    seconds: float = 0.0  # for one-shot checks (gradcheck): how long the call took


ALL_EVENTS = ALL_EVENTS + (GradClip, ScalerStep, ActivationCheckpoint, DebugModeSet)
EVENT_KINDS.update({cls.kind: cls for cls in (GradClip, ScalerStep, ActivationCheckpoint, DebugModeSet)})


def add_event_kinds(*classes: type[Event]) -> None:
    """Make the event kinds of another framework's observer known (``keras/events.py``,
    ``tfdata/events.py``): a check's ``on_<kind>`` is validated against ``EVENT_KINDS`` when
    it is registered, and the session dispatches only the kinds listed there."""
    for cls in classes:
        known = EVENT_KINDS.get(cls.kind)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise ValueError(f"event kind {cls.kind!r} defined twice ({known.__name__}, {cls.__name__})")
        EVENT_KINDS[cls.kind] = cls
