"""The events the Keras and TensorFlow observers emit on the run's ``Session``.

The Keras observer (``keras/instrument.py``, ``keras/tf_loops.py``) turns what it sees into
plain facts (``keras/facts.py``) and emits them like the torch instrumentation emits its
events: ``session.emit(KerasBatch(...))``. The session dispatches them to the checks that
define ``on_<kind>`` (``on_keras_batch`` …), with its one rule for a failing handler (an
internal error, and the handler's check disabled). Importing this module never imports
Keras or TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from nndoctor.core.events import Event, add_event_kinds
from nndoctor.core.findings import Location
from nndoctor.keras.facts import BatchFacts, ModelCall, TraceHistory


@dataclass(eq=False)
class KerasBatch(Event):
    """A batch with its predictions: the first of each ``fit``/``evaluate`` call (read before the
    loss runs), the first input a custom loop gives its model under a ``GradientTape``, and the
    first calls of a Keras loss object from the user's code."""

    kind: ClassVar[str] = "keras_batch"
    facts: BatchFacts | None = None


@dataclass(eq=False)
class KerasModelCall(Event):
    """A model with mode-dependent layers called from a custom loop: under a ``GradientTape``,
    emitted when the optimizer step shows it is trained (``updated_variables`` of its
    variables); outside any tape, when called with ``training=True`` after it was trained."""

    kind: ClassVar[str] = "keras_model_call"
    call: ModelCall | None = None
    updated_variables: int = 0


@dataclass(eq=False)
class FunctionTraced(Event):
    """A ``tf.function`` called from the user's code traced a new graph (its first call excluded)."""

    kind: ClassVar[str] = "function_traced"
    history: TraceHistory | None = None
    called_at: Location | None = None


@dataclass(eq=False)
class FitStarted(Event):
    """``model.fit`` was called: the arrays it was given (``labels`` is None for a dataset or a
    generator) and how it will draw batches from them."""

    kind: ClassVar[str] = "fit_started"
    model: Any = None
    labels: Any = None  # the ``y`` given to fit
    arrays: bool = False  # ``x`` is an array (fit batches it, honouring ``shuffle``)
    shuffle: Any = True  # as given: True, False or "batch"
    batch_size: int = 32
    validation_split: float = 0.0
    stateful: bool = False  # a stateful layer (RNN): the order is required
    called_at: Location | None = None


@dataclass(eq=False)
class TrainLoss(Event):
    """A training loss of a Keras/TensorFlow run. In ``fit`` (``in_fit``) only a non-finite one is
    emitted at once: Keras's running mean over the epoch after a batch, or an eager step's loss read
    before its update (``exact``: ``model`` and ``inputs`` are the failing batch's); the finite
    running means reach the checks in ``FitEnded.means``. In a custom loop: every target of an
    eager ``tape.gradient``, or the loss a compiled training step returned (``compiled``)."""

    kind: ClassVar[str] = "train_loss"
    value: float = 0.0
    series: Any = None  # what the loss belongs to: id(model) in fit, ("loop", line) in a custom loop
    where: str = "fit"  # "fit" or "the training loop"
    called_at: Location | None = None
    model: Any = None  # the model and its input, to run again through the layers (N101)
    inputs: Any = None
    exact: bool = False
    compiled: bool = False
    in_fit: bool = True
    optimizers: frozenset[int] = field(default_factory=frozenset)  # stepped so far outside fit


@dataclass(eq=False)
class InitialLoss(Event):
    """The classification loss of a model's first batch, before any update (a fit's first batch,
    or a Keras loss object called by a custom loop before its first optimizer step)."""

    kind: ClassVar[str] = "initial_loss"
    series: Any = None
    value: float = 0.0
    classes: int = 0
    where: str = "fit"
    called_at: Location | None = None


@dataclass(eq=False)
class FitEnded(Event):
    """``model.fit`` returned (or raised): its training losses as Keras reported them."""

    kind: ClassVar[str] = "fit_ended"
    model: Any = None
    inputs: Any = None  # the x given to fit, when it is an array still alive
    validation_split: float = 0.0
    called_at: Location | None = None
    first_step: int = 0  # the run's step when fit began
    means: list[tuple[int, float]] = field(default_factory=list)  # (batch, logs["loss"])
    accuracies: list[tuple[int, float]] = field(default_factory=list)  # (batch, logs' accuracy)
    classes: int = 0  # outputs of a sparse/categorical cross-entropy classifier
    batch_size: int = 32


@dataclass(eq=False)
class GradientsApplied(Event):
    """A custom loop's optimizer applied gradients eagerly on a sampled step: their norms."""

    kind: ClassVar[str] = "gradients_applied"
    optimizer: int = 0  # id of the optimizer
    norms: list[tuple[str, float]] = field(default_factory=list)  # (variable, norm)
    called_at: Location | None = None


add_event_kinds(KerasBatch, KerasModelCall, FunctionTraced, FitStarted, TrainLoss, InitialLoss, FitEnded,
                GradientsApplied)
