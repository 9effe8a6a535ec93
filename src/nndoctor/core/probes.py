"""The probes a check can ask for: instrumentation installed only when an enabled check (or a
subscriber, like the perf recorder) needs it.

A check lists the probes it reads in ``needs`` (``needs = frozenset({"construction_sites"})``);
the events it reads it declares by its ``on_<kind>`` methods. At install time the
instrumentation installs the cheap core hooks (module and optimizer hooks, the patches that
emit events, step counting, crash context) for every run, each probe below only when an
enabled check needs it, and the patches that produce an event kind only when some check or
listener subscribes to that kind. ``instrument/extensions.py`` maps each name to its installer.

The Keras and tf.data observers have their own probes (``KERAS_PROBES``), installed the same
way once the script imports Keras or TensorFlow.

Importing this module imports no framework (the registry validates ``needs`` against it).
"""

from __future__ import annotations

PROBES: dict[str, str] = {
    "target_ranges": "class targets of cross_entropy / nll_loss, read before the loss runs",
    "nonfinite_tracer": "forward hooks armed after a non-finite loss, to find the first non-finite module",
    "construction_sites": "the user's line that built each BatchNorm, Conv, Linear layer and optimizer",
    "seed_calls": "calls of torch, random and numpy seeding functions",
    "dropout_calls": "functional dropout called without training= inside an eval-mode module",
    "gc_clock": "time spent in Python's garbage collector",
    "compile_log": "torch.compile's recompile-limit warnings",
    "tensorboard_writers": "add_*, flush and close calls of each torch.utils.tensorboard SummaryWriter",
    "stall_watchdog": "a thread that notices a run that stopped making progress",
    # Needed by the perf recorder (an internal subscriber of ``nndoctor perf``), not by a check.
    "perf_timers": "the start of each top-level forward, CUDA synchronisations and host-device copies",
}

# The probes of the Keras and tf.data observers (checks of scope "keras" and "tfdata" name these
# in ``needs``). They are installed when the script imports Keras (tf.data: TensorFlow), right
# after the observer adds its family's enabled checks to the session: ``keras/probes.py`` and
# ``tfdata/instrument.py`` map each name to its installer.
KERAS_PROBES: dict[str, str] = {
    "keras_batches": "x, y and the predictions of the first batch of each fit/evaluate, read in "
                     "Model.compute_loss before the loss runs",
    "tf_graph_stats": "TensorFlow backend: the same batch kept by nndoctor's variables inside fit/evaluate's "
                      "traced step (keras/tf_graph_probe.py), read after the call",
    "keras_loss_calls": "the first calls of a Keras loss object from a custom loop (its predictions, and its "
                        "value before the first optimizer step)",
    "fit_losses": "fit's training losses and accuracy (logs of each batch), and an eager step's non-finite "
                  "loss read before its update",
    "tape_losses": "TensorFlow backend: the loss given to tape.gradient (eager) or returned by a compiled "
                   "training step in a custom loop",
    "keras_model_calls": "TensorFlow backend: the user's model calls in a custom loop (training flag, the "
                         "first input under a GradientTape, the batch of the step)",
    "gradient_norms": "TensorFlow backend: per-variable norms of the gradients an eager custom loop applies",
    "tf_datasets": "tf.data pipelines the script iterates: their stages, fetch times and first labels",
}

# Check scopes whose probes are KERAS_PROBES (their observers install them).
KERAS_SCOPES = ("keras", "tfdata")


def probes_of_scope(scope: str) -> dict[str, str]:
    """The probes a check of this scope may name in ``needs``: those its observer installs."""
    return KERAS_PROBES if scope in KERAS_SCOPES else PROBES
