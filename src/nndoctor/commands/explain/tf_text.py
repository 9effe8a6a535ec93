"""Reading TensorFlow's and Keras's error messages: pure functions of text.

TensorFlow wraps the op's message in its own decorations: ``{{function_node __wrapped__…}}``
before it, ``[Op:MatMul]`` / ``[[{{node sequential/dense/MatMul}}]]`` after it, and for graph
errors a "Detected at node 'X' defined at (most recent call last):" list of frames. Keras 3
puts ANSI bold codes around the message of a layer call. These helpers take what the
explanations need out of that: the node (which names the layer through its name scopes), the
op, and shapes written as ``(None, 28, 28, 1)`` or ``[4,8]``.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NODE = re.compile(r"\[\[\{\{node (?P<node>[^}]+)\}\}|Detected at node '?(?P<detected>[^'\s]+)'?"
                   r"|^Node: '(?P<named>[^']+)'", re.M)
_OP = re.compile(r"\[Op:(?P<op>[\w.]+)\]")
# TensorFlow's own name scopes: the layer is the last scope that is not an op's internal one.
_INTERNAL_SCOPES = re.compile(r"^(?:while|cond|gradient_tape|gradients|compile_loss|StatefulPartitionedCall"
                              r"|PartitionedCall|ParseSingleExample|ParseExample|[A-Z]\w*)$")


def plain(text: str) -> str:
    """``text`` without ANSI colour codes."""
    return _ANSI.sub("", text)


def node_name(text: str) -> str | None:
    """The graph node an error names ("sequential/dense_1/MatMul"), if any."""
    for found in _NODE.finditer(text):
        name = found.group("node") or found.group("detected") or found.group("named")
        if name:
            return name.strip()
    return None


def op_name(text: str) -> str | None:
    found = _OP.search(text)
    return found.group("op") if found else None


def layer_from_node(node: str | None) -> str | None:
    """The Keras layer in a node's name scopes: "sequential/conv2d_1/Conv2D" -> "sequential/conv2d_1".

    Op names are CamelCase ("Conv2D", "MatMul"); layer and model names are snake_case, so the
    scopes up to the last snake_case one name the layer."""
    if not node:
        return None
    parts = node.split("/")
    kept = [p for p in parts[:-1] if not _INTERNAL_SCOPES.match(p)]
    return "/".join(kept) if kept else None


def parse_shape(text: str) -> list[int | None] | None:
    """``"(None, 28, 28)"`` / ``"[4,8]"`` / ``"(4,)"`` -> ``[None, 28, 28]`` / ``[4, 8]`` / ``[4]``."""
    inner = text.strip().strip("()[]")
    if not inner.strip():
        return []
    shape: list[int | None] = []
    for part in inner.split(","):
        part = part.strip()
        if not part:
            continue
        if part in ("None", "?", "-1"):
            shape.append(None)
        elif part.isdigit():
            shape.append(int(part))
        else:
            return None
    return shape


def show_shape(shape: list[int | None]) -> str:
    inner = ", ".join("None" if s is None else str(s) for s in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"
