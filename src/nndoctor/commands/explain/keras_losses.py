"""K101, K103 and K109 as a log shows them: Keras's warning about ``from_logits=True`` on a Softmax
output, and TensorFlow's "logits and labels must have the same first dimension" for one-hot
labels given to a sparse loss, and TensorFlow's tf.function retracing warning. The live checks
(``keras/checks.py``, ``keras/loop_checks.py``) own the codes; these are their explanations from
text, so ``nndoctor explain`` finds them in a pasted log."""

from __future__ import annotations

from typing import Any

from nndoctor.commands.explain.base import CrashExplanation, variant
from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.tf_text import layer_from_node, node_name, plain
from nndoctor.core.findings import Finding, Severity


@variant
class SoftmaxWithFromLogitsWarning(CrashExplanation):
    """
    ## What it does
    From a log: reports Keras's warning "`sparse_categorical_crossentropy` received
    `from_logits=True`, but the `output` argument was produced by a Softmax activation and
    thus does not represent logits" (Keras 2 and 3, TensorFlow backend), which Keras prints
    once and then trains on.

    ## References
    - Keras source, the warning (keras/src/backend/tensorflow/nn.py, `_get_logits`): https://github.com/keras-team/keras/blob/master/keras/src/backend/tensorflow/nn.py
    """

    code = "K101"
    name = "softmax-with-from-logits"
    severity = Severity.ERROR
    summary = "softmax/sigmoid outputs into a loss with `from_logits=True`"
    fix = "Remove the final softmax/sigmoid (output logits), or compile the loss with from_logits=False."
    patterns = (r"`?(?P<loss>\w+)`? received `from_logits=True`, but the `output` argument was produced by an? "
                r"(?P<activation>[\w ]+?) activation and thus does not represent logits",)
    warning_lines = (r"received `from_logits=True`, but the `output` argument was produced by an? [\w ]+? activation",)
    preamble_evidence = False
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        loss, activation = facts["loss"], facts["activation"]
        message = (f"{loss} was built with from_logits=True, but the model's output comes from a {activation} "
                   "activation: the loss applies softmax/sigmoid a second time, which squeezes the outputs "
                   "and shrinks the gradients (training is slow or stalls; nothing crashes).")
        return cls.make(crash, message, evidence={"loss": loss, "activation": activation})


@variant
class OneHotLabelsWithSparseLoss(CrashExplanation):
    """
    ## What it does
    TensorFlow: explains "logits and labels must have the same first dimension, got logits
    shape [32,10] and labels shape [320]" when the labels hold exactly classes × rows values:
    one-hot labels (flattened by the sparse loss) given to ``SparseCategoricalCrossentropy``.
    Any other pair of shapes is left unexplained (a sequence model's time axis, a reshape).

    ## References
    - TensorFlow, tf.keras.losses.SparseCategoricalCrossentropy (integer labels): https://www.tensorflow.org/api_docs/python/tf/keras/losses/SparseCategoricalCrossentropy
    - TensorFlow source, the message (SparseSoftmaxXentWithLogitsOp): https://github.com/tensorflow/tensorflow/blob/master/tensorflow/core/kernels/sparse_xent_op.cc
    """

    code = "K103"
    name = "label-encoding-mismatch"
    severity = Severity.ERROR
    summary = "one-hot labels with a sparse loss, or integer labels with a categorical loss"
    fix = ("Use the loss that matches the labels: CategoricalCrossentropy for one-hot labels, or "
           "SparseCategoricalCrossentropy with integer ids (labels.argmax(-1)).")
    patterns = (r"logits and labels must have the same first dimension, got logits shape "
                r"\[(?P<rows>\d+),\s*(?P<classes>\d+)\] and labels shape \[(?P<labels>\d+)\]",)
    log_lines = (r"logits and labels must have the same first dimension, got logits shape \[\d+,\s*\d+\]",)
    preamble_evidence = False
    order = 30

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        facts = super().match(crash)
        if facts is None:
            return None
        rows, classes, labels = int(facts["rows"]), int(facts["classes"]), int(facts["labels"])
        # One-hot labels of `rows` samples flatten to rows × classes values; any other count
        # has another cause that the message alone does not tell.
        return facts if classes > 1 and labels == rows * classes else None

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        rows, classes, labels = int(facts["rows"]), int(facts["classes"]), int(facts["labels"])
        layer = layer_from_node(node_name(plain(crash.text)))
        evidence: dict[str, Any] = {"logits_shape": [rows, classes], "labels_values": labels}
        if layer:
            evidence["layer"] = layer
        message = (f"The sparse loss got {labels} labels for {rows} samples of {classes} classes: "
                   f"{labels} = {rows} × {classes}, so the labels are one-hot vectors, which a Sparse* loss "
                   "reads as one class id per value.")
        return cls.make(crash, message, evidence=evidence)


@variant
class RetracingWarning(CrashExplanation):
    """
    ## What it does
    From a log: reports TensorFlow's warning "N out of the last M calls to <function …>
    triggered tf.function retracing. Tracing is expensive …", naming the function and the
    counts, with the three causes TensorFlow lists (a tf.function or model created in a loop,
    tensors of changing shapes, Python objects instead of tensors).

    ## References
    - TensorFlow guide, Better performance with tf.function: controlling retracing: https://www.tensorflow.org/guide/function#controlling_retracing
    """

    code = "K109"
    name = "tf-function-retracing"
    severity = Severity.WARNING
    summary = "a tf.function retraced every step (Python scalars or varying shapes as arguments)"
    fix = ("create the tf.function (or the model whose predict/fit you call) once, outside the loop; pass "
           "tensors instead of Python numbers; give varying shapes an input_signature or reduce_retracing=True")
    # The function's repr holds "<locals>": "<function Model.make_predict_function.<locals>.predict_function at 0x7f…>".
    patterns = (r"(?P<retraced>\d+) out of the last (?P<calls>\d+) calls to <function (?P<function>\S+?)"
                r"(?: at 0x[0-9a-fA-F]+)?> triggered tf\.function retracing",)
    warning_lines = (r"out of the last \d+ calls to <function \S+?(?: at 0x[0-9a-fA-F]+)?> triggered tf\.function retracing",)
    preamble_evidence = False
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        retraced, calls, function = int(facts["retraced"]), int(facts["calls"]), facts["function"]
        message = (f"TensorFlow traced {function} again on {retraced} of its last {calls} calls: every retrace "
                   "rebuilds the graph, which costs far more than running it. TensorFlow names three causes: the function (or the Keras "
                   "model whose predict/fit/evaluate builds it) is created anew in a loop, its tensors change "
                   "shape, or it receives Python objects instead of tensors.")
        return cls.make(crash, message, evidence={"function": function, "retraced": retraced, "calls": calls})
