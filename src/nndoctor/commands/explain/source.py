"""Source-aware hints: facts about the user's code near the failing line, read with ``ast``.

Only hints that are certain from the code are produced: an expression statement
``x.to(device)`` whose result is thrown away, a ``with torch.no_grad():`` block around a
line, the statement on the failing line. Reading uses ``linecache`` (works for the script
that just ran) and never imports or executes anything.
"""

from __future__ import annotations

import ast
import linecache
from dataclasses import dataclass

_MOVE_METHODS = ("to", "cuda", "cpu")
_NO_GRAD_NAMES = ("no_grad", "inference_mode")


@dataclass(frozen=True)
class DiscardedMove:
    """``x.to(device)`` as a statement: tensors are not moved in place, so it does nothing."""

    line: int
    target: str  # the expression whose ``.to`` was called, e.g. ``x`` or ``batch["image"]``
    text: str


def _tree(path: str) -> ast.Module | None:
    lines = linecache.getlines(path)
    if not lines:
        return None
    try:
        return ast.parse("".join(lines))
    except (SyntaxError, ValueError):
        return None


def _enclosing_body(tree: ast.Module, line: int) -> list[ast.stmt]:
    """Statements of the innermost function around ``line`` (the module body at top level)."""
    best: list[ast.stmt] = tree.body
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = getattr(node, "end_lineno", None) or node.lineno
            if node.lineno <= line <= end:
                best = node.body
    return best


def discarded_moves(path: str, line: int, window: int = 40) -> list[DiscardedMove]:
    """``t.to(...)``/``t.cuda()``/``t.cpu()`` statements whose result is unused, in the same
    function as ``line`` and at most ``window`` lines before it (nearest first)."""
    tree = _tree(path)
    if tree is None:
        return []
    found: list[DiscardedMove] = []
    for statement in _enclosing_body(tree, line):
        for node in ast.walk(statement):
            if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
                continue
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr in _MOVE_METHODS:
                if line - window <= node.lineno <= line:
                    text = line_text(path, node.lineno)
                    found.append(DiscardedMove(node.lineno, ast.unparse(func.value), text))
    return sorted(found, key=lambda d: -d.line)


def no_grad_block_around(path: str, line: int) -> int | None:
    """The line of a ``with torch.no_grad():`` / ``inference_mode()`` block containing ``line``."""
    tree = _tree(path)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            end = getattr(node, "end_lineno", None) or node.lineno
            if node.lineno <= line <= end and any(
                any(name in ast.unparse(item.context_expr) for name in _NO_GRAD_NAMES) for item in node.items
            ):
                return node.lineno
    return None


def statement_at(path: str, line: int) -> ast.stmt | None:
    """The innermost statement that starts on ``line``."""
    tree = _tree(path)
    if tree is None:
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno == line:
            found = node
    return found


def strip_comment(text: str) -> str:
    """A source line without its trailing ``# comment`` (left alone when '#' may be in a string)."""
    head, sep, _ = text.partition("#")
    if sep and "'" not in head and '"' not in head:
        return head.rstrip()
    return text.rstrip()


def line_text(path: str, line: int | None) -> str:
    """The source line, stripped of indentation and trailing comment."""
    return strip_comment(linecache.getline(path, line).strip()) if line else ""
