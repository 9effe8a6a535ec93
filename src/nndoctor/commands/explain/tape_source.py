"""Why a ``tf.GradientTape`` recorded no path from the loss to the variables, read from the
user's source with ``ast`` (pure: a file's text and a line number in, facts out).

Around the failing line it finds the ``tape.gradient(loss, sources)`` call and the
``with tf.GradientTape() as tape:`` block, then follows the loss back through the block's
assignments. What it reports is certain from the code: the loss assigned outside the block
(the tape never saw it), a conversion to NumPy or Python numbers on the loss's path
(``.numpy()``, ``np.…``, ``float()``), an op without a gradient on that path (``argmax``,
``round``, a cast to integers, ``stop_gradient``), or a loss that never uses the model whose
variables are differentiated.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

_NO_GRADIENT_CALLS = {"argmax", "argmin", "round", "floor", "ceil", "sign", "stop_gradient", "numpy_function",
                      "equal", "not_equal", "greater", "less", "greater_equal", "less_equal", "top_k",
                      "unique", "one_hot", "histogram_fixed_width", "cast_to_int"}
_INTEGER_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "bool", "string"}
_PYTHON_NUMBERS = {"float", "int", "bool", "list"}


@dataclass
class TapeFacts:
    gradient_line: int | None = None
    tape_line: int | None = None  # the ``with tf.GradientTape()`` line
    target: str = ""  # the loss expression given to tape.gradient
    sources: str = ""  # the sources expression (model.trainable_variables)
    target_outside_tape: int | None = None  # line of the loss's assignment outside the block
    blockers: list[tuple[int, str, str]] = field(default_factory=list)  # (line, code, kind)
    model_unused: str | None = None  # the model named in sources that the loss never calls


def _is_tape(expr: ast.AST) -> bool:
    call = expr if isinstance(expr, ast.Call) else None
    func = call.func if call is not None else None
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name == "GradientTape"


def _scope_of(tree: ast.AST, line: int) -> ast.AST:
    """The innermost function containing ``line`` (the module when none does)."""
    best: ast.AST = tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or 0):
            if best is tree or node.lineno >= best.lineno:  # type: ignore[attr-defined]
                best = node
    return best


def _walk_scope(scope: ast.AST):
    """Nodes of ``scope`` without descending into nested functions/classes."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _names(expr: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}


def _root(expr: ast.AST) -> str | None:
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _call_name(call: ast.Call) -> tuple[str | None, str]:
    """(module root, function name): ``tf.math.argmax`` -> ("tf", "argmax"), ``x.numpy`` -> ("x", "numpy")."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return _root(func.value), func.attr
    if isinstance(func, ast.Name):
        return None, func.id
    return None, ""


def blocker_kind(call: ast.Call, numpy_aliases: set[str]) -> str | None:
    """"numpy" / "python" / "no-gradient" when ``call`` cuts the gradient, else None."""
    root, name = _call_name(call)
    if name == "numpy" and not call.args:
        return "numpy"
    if root in numpy_aliases:
        return "numpy"
    if root is None and name in _PYTHON_NUMBERS:
        return "python"
    if name == "item" and not call.args:
        return "python"
    if name in _NO_GRADIENT_CALLS and root is not None:
        return "no-gradient"
    if name == "cast":
        dtype = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "dtype"), None)
        text = ast.unparse(dtype) if dtype is not None else ""
        if any(text.endswith(t) or text.strip("'\"") == t for t in _INTEGER_DTYPES):
            return "no-gradient"
    if name == "constant" and root is not None and call.args and _names(call.args[0]):
        return "numpy"  # tf.constant(tensor_value): a copy made outside the tape's record
    return None


def _numpy_aliases(tree: ast.AST) -> set[str]:
    aliases = {"np", "numpy"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == "numpy"}
    return aliases


def analyse(source: str, line: int) -> TapeFacts | None:
    """Facts about the ``tape.gradient`` call nearest before ``line`` in its scope, or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    scope = _scope_of(tree, line)
    nodes = list(_walk_scope(scope))
    tapes: dict[str | None, ast.With | ast.AsyncWith] = {}
    for node in nodes:
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if _is_tape(item.context_expr) and isinstance(item.optional_vars, ast.Name):
                    tapes[item.optional_vars.id] = node
    gradients: list[Any] = [n for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr == "gradient" and _root(n.func.value) in tapes and len(n.args) >= 2
                 and n.lineno <= line]
    if not gradients:
        return None
    call = max(gradients, key=lambda n: n.lineno)
    block = tapes[_root(call.func.value)]
    facts = TapeFacts(gradient_line=call.lineno, tape_line=block.lineno, target=ast.unparse(call.args[0]),
                      sources=ast.unparse(call.args[1]))
    assignments = _assignments(nodes, call.lineno)
    inside = {id(n) for n in ast.walk(block)}
    target_names = _names(call.args[0])
    # The loss's last assignment before the gradient call: outside the block, nothing was recorded.
    for name in target_names:
        last = assignments.get(name, [])
        if last and id(last[-1]) not in inside and last[-1].lineno > block.lineno:
            facts.target_outside_tape = last[-1].lineno
        elif last and id(last[-1]) not in inside and last[-1].lineno < block.lineno and not _assigned_in(block, name):
            facts.target_outside_tape = last[-1].lineno
    aliases = _numpy_aliases(tree)
    feeding = _feeding_statements(target_names, assignments, call.lineno)
    called: set[str] = set()
    for statement in feeding:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call):
                root, name = _call_name(node)
                if root is None:
                    called.add(name)
                kind = blocker_kind(node, aliases)
                if kind and id(statement) in inside:
                    facts.blockers.append((node.lineno, ast.unparse(node), kind))
    facts.blockers.sort()
    model = _root(call.args[1])
    if model and model not in ("tf", "self") and feeding and model not in called \
            and not any(model in _names(s) for s in feeding):
        facts.model_unused = model
    return facts


def _assignments(nodes: list[ast.AST], before: int) -> dict[str, list[ast.stmt]]:
    found: dict[str, list[ast.stmt]] = {}
    for node in sorted((n for n in nodes if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))),
                       key=lambda n: n.lineno):
        if node.lineno > before:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for name in _names(target):
                found.setdefault(name, []).append(node)
    return found


def _assigned_in(block: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(block))


def _feeding_statements(names: set[str], assignments: dict[str, list[ast.stmt]], before: int) -> list[ast.stmt]:
    """The assignments the loss depends on, followed back through the names they read."""
    seen: set[int] = set()
    result: list[ast.stmt] = []
    pending = [(name, before + 1) for name in names]
    while pending and len(result) < 200:
        name, limit = pending.pop()
        earlier = [a for a in assignments.get(name, []) if a.lineno < limit]
        if not earlier:
            continue
        statement = earlier[-1]
        if id(statement) in seen:
            continue
        seen.add(id(statement))
        result.append(statement)
        value = getattr(statement, "value", None)
        if value is not None:
            pending.extend((n, statement.lineno) for n in _names(value))
    return result
