"""E133: "No gradients provided for any variable" — which variables, and why no gradient reached them.

Three sources of the *why*, strongest first:
- in a traced step (``model.fit``, a ``tf.function``), the loss is a graph tensor: walking its
  graph back from the loss finds the op on the way to the variables that has no gradient
  (``ArgMax``, ``Round``, a ``Cast`` to integers, ``StopGradient``, a ``numpy_function``),
  named with the layer from its name scopes — or finds that no variable is read at all;
- the user's source around the failing line (``tape_source``): the loss computed outside the
  ``GradientTape`` block, ``.numpy()`` / ``np.…`` / ``float()`` on the loss's path, a model
  whose variables are differentiated but which the loss never calls;
- in a live run, the sources given to ``tape.gradient``: tensors (a tape watches only
  trainable variables unless told ``tape.watch``) or non-trainable variables.
"""

from __future__ import annotations

import re
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation
from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.tape_source import TapeFacts, analyse
from nndoctor.commands.explain.tf_text import layer_from_node
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register

_VARIABLE_READS = {"ReadVariableOp", "ResourceGather", "VarHandleOp", "VariableV2", "Variable"}
_KNOWN_BLOCKERS = {"ArgMax", "ArgMin", "Round", "Floor", "Ceil", "Sign", "StopGradient", "PyFunc",
                   "PyFuncStateless", "Equal", "NotEqual", "Greater", "Less", "GreaterEqual", "LessEqual",
                   "TopKV2", "OneHot", "Unique", "RandomUniformInt"}
_MAX_OPS = 50000


def variable_names_from_message(message: str) -> list[str]:
    """Variable names listed by Keras 2 / TF 1 ("['dense/kernel:0', …]", "<tf.Variable 'w:0' …>")."""
    names = re.findall(r"tf\.Variable '([^']+)'", message)
    if names:
        return names
    listed = re.search(r"No gradients provided for any variable:\s*\(?\[(?P<list>[^\]]*)\]", message)
    if listed:
        return re.findall(r"'([^']+)'", listed.group("list"))
    return []


def _is_float(tensor: Any) -> bool:
    dtype = getattr(tensor, "dtype", None)
    return bool(getattr(dtype, "is_floating", False) or getattr(dtype, "is_complex", False))


def _cuts_gradient(op: Any) -> bool:
    if op.type in _KNOWN_BLOCKERS:
        return True
    float_in = any(_is_float(t) for t in op.inputs)
    float_out = any(_is_float(t) for t in op.outputs)
    return float_in and bool(op.outputs) and not float_out  # e.g. a Cast to int32


def graph_blockers(loss: Any, limit: int = 3) -> tuple[list[tuple[str, str]], bool] | None:
    """([(op type, op name)] of ops cutting the path from variables to ``loss``, whether any
    variable is read at all), or None when ``loss`` is not a graph tensor."""
    op = getattr(loss, "op", None)
    try:
        if op is None or not hasattr(op, "inputs") or getattr(loss, "graph", None) is None:
            return None
        order: list[Any] = []  # TF operations
        seen, queue = {op.name}, [op]
        while queue and len(order) < _MAX_OPS:
            current = queue.pop(0)
            order.append(current)
            for tensor in current.inputs:
                parent = tensor.op
                if parent.name not in seen:
                    seen.add(parent.name)
                    queue.append(parent)
    except (AttributeError, ValueError, TypeError):
        return None  # an eager tensor: no graph to walk
    reads = _reads_variables(order)
    blockers = []
    for current in order:
        if _cuts_gradient(current) and any(reads.get(t.op.name, False) for t in current.inputs):
            blockers.append((current.type, current.name))
            if len(blockers) >= limit:
                break
    return blockers, reads.get(op.name, False)


def _reads_variables(ops: list[Any]) -> dict[str, bool]:
    """op name -> whether a variable is read upstream of it (post-order DFS, no recursion)."""
    reads: dict[str, bool] = {}
    visiting: set[str] = set()  # TF1 while loops make cycles: a node in progress counts as False
    for start in ops:
        stack = [(start, False)]
        while stack:
            current, expanded = stack.pop()
            if current.name in reads or (not expanded and current.name in visiting):
                continue
            visiting.add(current.name)
            parents = [t.op for t in current.inputs]
            if expanded or not parents:
                reads[current.name] = current.type in _VARIABLE_READS or any(
                    reads.get(p.name, False) for p in parents)
                continue
            stack.append((current, True))
            stack.extend((p, False) for p in parents if p.name not in reads)
    return reads


_WHY = {
    "numpy": "converts to NumPy inside the tape: the tape records TensorFlow ops only, so the value "
             "comes back as a constant with no path to the variables",
    "python": "turns a tensor into a Python number: the tape cannot follow it",
    "no-gradient": "has no gradient (an integer or boolean result, or a rounded value)",
}


def _graph_words(blockers: list[tuple[str, str]], reads_any: bool) -> tuple[str, str] | None:
    if blockers:
        op_type, op = blockers[0]
        layer = layer_from_node(op)
        others = f" (also: {', '.join(t for t, _ in blockers[1:])})" if len(blockers) > 1 else ""
        where = f" in layer '{layer.rsplit('/', 1)[-1]}' ({op})" if layer else f" ({op})"
        return (f"the op {op_type}{where} lies between the variables and the loss and has no gradient{others}",
                "keep the path from the model's output to the loss differentiable: use the probabilities or "
                "logits instead of argmax/round/integer casts (a soft version such as softmax or sigmoid), and "
                "apply such ops only to metrics")
    if not reads_any:
        return ("the loss does not read any variable: it is computed from the inputs or labels only",
                "compute the loss from the model's output (y_pred), and check that a custom loss uses it")
    return None


def _source_words(facts: TapeFacts) -> tuple[str, str] | None:
    if facts.target_outside_tape is not None:
        return (f"`{facts.target}` is computed at line {facts.target_outside_tape}, outside the "
                f"`with tf.GradientTape()` block (line {facts.tape_line}): the tape records only what runs inside it",
                f"compute `{facts.target}` (the forward pass and the loss) inside the `with tf.GradientTape() as tape:` block")
    if facts.blockers:
        line, code, kind = facts.blockers[0]
        return (f"line {line} `{code}` {_WHY[kind]}",
                "keep the loss's computation in TensorFlow ops inside the tape (no .numpy(), np.…, float(); "
                "no argmax/round/integer casts on the path to the loss)")
    if facts.model_unused:
        return (f"the loss never uses `{facts.model_unused}`, whose variables are differentiated "
                f"(`tape.gradient({facts.target}, {facts.sources})`)",
                f"compute the loss from `{facts.model_unused}`'s output, or differentiate the variables of the model the "
                "loss does use")
    return None


@register
class TensorFlowNoGradients(CrashExplanation):
    """
    ## What it does
    Explains TensorFlow/Keras's "No gradients provided for any variable": names the variables
    (from the message, or in a live run from the optimizer's arguments) and why no gradient
    reached them. In a traced step (``fit``, ``tf.function``) it walks the loss's graph to
    the op without a gradient (``ArgMax``, ``Round``, a ``Cast`` to integers, ``StopGradient``)
    and names its layer, or finds that the loss reads no variable at all. In a custom loop it
    reads the ``GradientTape`` block in the user's code: the loss computed outside the block,
    ``.numpy()``/NumPy/``float()`` on the loss's path, or a loss that never calls the model
    whose variables are differentiated. It also reports sources that a tape does not watch
    (tensors without ``tape.watch``, non-trainable variables).

    ## Why is this bad?
    The optimizer receives ``None`` for every gradient and TensorFlow says only that. The cause
    is upstream, in how the loss was computed, and the message names neither the op nor the line.

    ## Example
    ```python
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = loss_fn(y, np.asarray(logits))        # NumPy copy: no path back to the model
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    ```

    ## Use instead
    ```python
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = loss_fn(y, logits)
    ```

    ## References
    - TensorFlow guide, "Introduction to gradients and automatic differentiation" (cases where
      the gradient is None): https://www.tensorflow.org/guide/autodiff#cases_where_gradient_returns_none
    - tensorflow/tensorflow#1511 and #1841 (no path between the variables and the loss), as users report it.
    """

    code = "E133"
    name = "tf-no-gradients"
    summary = "no gradient reached any variable: the loss's path is cut (non-differentiable op, NumPy, outside the tape)"
    fix = ("compute the loss inside the GradientTape from the model's output with TensorFlow ops only "
           "(no .numpy()/NumPy, argmax, round or integer casts on its path)")
    patterns = (r"No gradients provided for any variable",)
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {}
        names = _live_variable_names(crash) or variable_names_from_message(crash.message)
        if names:
            evidence["variables"] = names[:50]
            evidence["variable_count"] = len(names)
        why = None
        graph = _live_graph_blockers(crash)
        if graph is not None:
            blockers, reads_any = graph
            if blockers:
                evidence["blocking_ops"] = [f"{t} {n}" for t, n in blockers]
            why = _graph_words(blockers, reads_any)
        tape = _tape_facts(crash)
        if tape is not None:
            evidence["gradient_line"] = tape.gradient_line
            if why is None:
                why = _source_words(tape)
            if tape.blockers:
                evidence["source_blockers"] = [f"line {line}: {code}" for line, code, _ in tape.blockers[:5]]
        watched = _unwatched_sources(crash)
        if why is None and watched:
            why = watched
        shown = ", ".join(names[:6]) + (f" (+{len(names) - 6} more)" if len(names) > 6 else "")
        message = "No gradient reached any of the variables" + (f" ({shown})" if names else "")
        fix = cls.fix
        if why is not None:
            message += f": {why[0]}."
            fix = why[1]
        else:
            message += (": the loss has no differentiable path to them (an op without a gradient, a NumPy "
                        "conversion inside the tape, or a loss computed outside the tape or from another model's output).")
        return cls.make(crash, message, fix=fix, evidence=evidence)


def _variable_label(variable: Any) -> str:
    for attribute in ("path", "name"):
        value = getattr(variable, attribute, None)
        if isinstance(value, str) and value:
            return value
    return type(variable).__name__


def _live_variable_names(crash: Crash) -> list[str]:
    if not crash.is_live:
        return []
    found = crash.frame_locals("_filter_empty_gradients")
    if found is not None and found.get("vars") is not None:
        return [_variable_label(v) for v in list(found["vars"])]
    found = crash.frame_locals("filter_empty_gradients")
    if found is not None and found.get("grads_and_vars") is not None:
        return [_variable_label(v) for _, v in list(found["grads_and_vars"])]
    # Keras filters its own frames out of the traceback; nndoctor's optimizer wrapper
    # (keras/tf_loops.py) stays in it and holds ``optimizer.apply(grads, variables)``'s arguments.
    found = crash.frame_locals("_apply", "tf_loops")
    if found is not None:
        args: tuple[Any, ...] = tuple(found.get("args") or ())
        kwargs: dict[str, Any] = dict(found.get("kwargs") or {})
        variables = kwargs.get("trainable_variables", args[1] if len(args) > 1 else None)
        if isinstance(variables, (list, tuple)):
            return [_variable_label(v) for v in variables]
    return []


def _live_graph_blockers(crash: Crash) -> tuple[list[tuple[str, str]], bool] | None:
    """The graph walk from the loss of the step that failed (``fit``'s train_step, or the user's
    traced function), when that loss is a graph tensor."""
    if not crash.is_live:
        return None
    candidates = []
    keras_step = crash.frame_locals("train_step", "keras")
    if keras_step is not None:
        candidates.append(keras_step.get("loss"))
    tape = _tape_facts(crash)
    user = _user_locals(crash)
    if tape is not None and user is not None and tape.target.isidentifier():
        candidates.append(user.get(tape.target))
    for loss in candidates:
        if loss is None:
            continue
        found = graph_blockers(loss)
        if found is not None:
            return found
    return _traced_model_blockers(crash, user)


def _traced_model_blockers(crash: Crash, user: dict[str, Any] | None) -> tuple[list[tuple[str, str]], bool] | None:
    """``fit`` traces its step in a function whose frames Keras removes from the traceback, so
    the loss is out of reach: trace the model called on the line (``model.fit(...)``) once more,
    symbolically, and walk the graph of its output. Tracing builds a graph and runs nothing:
    no weight, optimizer or random state changes."""
    frame = crash.user_frame
    match = re.search(r"([A-Za-z_]\w*)\.(?:fit|train_on_batch)\(", frame.source if frame else "")
    model = user.get(match.group(1)) if match and user else None
    if model is None or not hasattr(model, "inputs") or not hasattr(model, "trainable_variables"):
        return None
    try:
        import keras
        import tensorflow as tf

        if keras.backend.backend() != "tensorflow":
            return None
        specs = [tf.TensorSpec(tensor.shape, tensor.dtype) for tensor in model.inputs]
        traced = tf.function(lambda *xs: model(xs[0] if len(xs) == 1 else list(xs), training=True))
        outputs = tf.nest.flatten(traced.get_concrete_function(*specs).structured_outputs)
    except Exception:  # noqa: BLE001 - a model that cannot be traced alone: no graph evidence
        return None
    layers = {getattr(layer, "name", "") for layer in getattr(model, "layers", [])}
    for output in outputs:
        found = graph_blockers(output)
        if found is not None and found[0]:
            # From the model's output, not the loss: only the blockers count. The second trace
            # numbers its name scopes ("to_class_1"); name the layers as the model does.
            return [(kind, _layer_names(name, layers)) for kind, name in found[0]], True
    return None


def _layer_names(op: str, layers: set[str]) -> str:
    parts = op.split("/")
    for i, part in enumerate(parts[:-1]):
        base = re.sub(r"_\d+$", "", part)
        if part not in layers and base in layers:
            parts[i] = base
    return "/".join(parts)


def _user_locals(crash: Crash) -> dict[str, Any] | None:
    frame = crash.user_frame
    if frame is None:
        return None
    for live in reversed(crash.live_frames()):
        if live.f_code.co_filename == frame.path and live.f_lineno == frame.line:
            return dict(live.f_locals)
    return None


def _tape_facts(crash: Crash) -> TapeFacts | None:
    frame = crash.user_frame
    if frame is None or frame.line is None:
        return None
    try:
        with open(frame.path, encoding="utf-8") as handle:
            source = handle.read()
    except (OSError, UnicodeDecodeError):
        return None
    return analyse(source, frame.line)


def _unwatched_sources(crash: Crash) -> tuple[str, str] | None:
    """Sources a tape does not watch: tensors (not variables) or non-trainable variables."""
    tape = _tape_facts(crash)
    user = _user_locals(crash)
    if tape is None or user is None or not tape.sources.isidentifier():
        return None
    sources = user.get(tape.sources)
    try:
        items = list(sources) if isinstance(sources, (list, tuple)) else [sources]
    except TypeError:
        return None
    tensors = [s for s in items if hasattr(s, "dtype") and not hasattr(s, "assign")]
    frozen = [s for s in items if hasattr(s, "assign") and getattr(s, "trainable", True) is False]
    if tensors:
        return (f"`{tape.sources}` holds tensors, not variables: a GradientTape watches only trainable "
                "variables unless told otherwise",
                f"call `tape.watch({tape.sources})` at the start of the tape block, or make them tf.Variable")
    if frozen:
        return (f"`{tape.sources}` holds non-trainable variables ({', '.join(_variable_label(v) for v in frozen[:4])}): "
                "a GradientTape does not watch them",
                "create them with trainable=True, or call tape.watch on them")
    return None
