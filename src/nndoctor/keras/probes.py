"""The Keras observer's probes: each name of ``nndoctor.core.probes.KERAS_PROBES`` (but "tf_datasets",
the tf.data observer's: ``tfdata/instrument.py``) and its installer.

A probe is installed when the script imports Keras, right after the observer has added the
enabled Keras checks to the session, and only when one of them (or of the session's other
checks) names it in ``needs``: ``instrument/features.install_features``, as for PyTorch's
probes. What every Keras run needs (step counting, ``--max-steps``, the fit/evaluate calls and
the user's lines of layers and compile, tf.function calls) is the observer's own, not a probe.

An installer is given the ``KerasObserver``; it patches through the installation's patcher
(undone at uninstall), or turns on a part of a core patch that only feeds its checks (the
gradient norms of the optimizer step, the loss reading of fit's callback). Importing this
module imports neither Keras nor TensorFlow.
"""

from __future__ import annotations

from typing import Any

from nndoctor.instrument.features import Feature


def _fit_losses(observer: Any) -> None:
    observer.install_fit_losses()


def _keras_batches(observer: Any) -> None:
    observer.install_batch_reader()


def _loss_calls(observer: Any) -> None:
    observer.install_loss_calls()


def _graph_stats(observer: Any) -> None:
    observer.install_graph_probe()


# The custom-loop probes live on the loop observer (``tf_loops.LoopObserver``); without one (its
# installation failed, and was reported) there is nothing to add them to.
def _tape_losses(observer: Any) -> None:
    if observer.loops is not None:
        observer.loops.install_tape_losses()


def _model_calls(observer: Any) -> None:
    if observer.loops is not None:
        observer.loops.install_model_calls()


def _gradient_norms(observer: Any) -> None:
    if observer.loops is not None:
        observer.loops.measure_gradients = True


def keras_probes(backend: str) -> tuple[Feature, ...]:
    """The probes of a Keras run on this backend ("torch" or "tensorflow"), in install order.

    The three ``Model.compute_loss`` wrappers stack in this order: the non-finite check after the
    loss innermost, then the batch reader, then the TensorFlow graph probe (outermost, so that it
    runs first)."""
    both = (
        # N101, L105, L106, L108: fit's training losses; N101: an eager step's non-finite loss
        Feature("fit_losses", _fit_losses, needed=True),
        # K101-K104, K108, D101, D107 (and L105/L108's class count): the first batch of fit/evaluate
        Feature("keras_batches", _keras_batches, needed=True),
        # K101 and L105 in custom loops: the first calls of a Keras loss object
        Feature("keras_loss_calls", _loss_calls, needed=True),
    )
    if backend != "tensorflow":
        return both
    return both + (
        # the same readers as keras_batches, for fit/evaluate's traced step
        Feature("tf_graph_stats", _graph_stats, needed=True),
        # N101, L106 in custom loops: the loss of tape.gradient or of a compiled step
        Feature("tape_losses", _tape_losses, needed=True),
        # K105, D101, N101 in custom loops: the user's model calls
        Feature("keras_model_calls", _model_calls, needed=True),
        # O104: the gradients an eager custom loop applies
        Feature("gradient_norms", _gradient_norms, needed=True),
    )
