"""Naming the variables of a TensorFlow checkpoint from its object graph.

``tf.train.Checkpoint`` stores each variable under the path by which it reached it first
(``_CHECKPOINTABLE_OBJECT_GRAPH``, a TrackableObjectGraph: nodes with named children and
serialized attributes). A Keras 3 model saved with its optimizer has its kernels stored as
``optimizer/_trainable_variables/0/...``: the optimizer's path is shorter than the model's.
So a model variable is named by the shortest path that avoids the optimizer
(``model/_functional/_operations/1/_kernel``): the path is what ``checkpoint.restore`` matches
on, so it is what ``diff`` compares. Its ``full_name`` (Keras' variable path,
``sequential/conv2d/kernel``) gives the Keras layer structure. Variables reachable only
through an optimizer (slots, iteration counters) are the optimizer's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from nndoctor.util.protowire import as_bytes, as_int, fields

_OPTIMIZER_CHILDREN = {"_iterations", "iter", "_learning_rate"}
ATTRIBUTE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
_METRICS = "keras_api/metrics/"  # Keras 2 SavedModels keep the compiled metrics' running totals


@dataclass
class GraphNode:
    children: list[tuple[int, str]] = field(default_factory=list)
    variable: tuple[str, str] | None = None  # (full_name, checkpoint_key) of a VARIABLE_VALUE attribute


@dataclass
class NamedVariable:
    key: str  # the bundle key
    name: str  # what the user is shown
    full_name: str  # the variable's own name in the framework ("" when unknown)
    role: str  # "model", "optimizer", "metric" (Keras metric totals) or "counter" (save_counter)


def parse_object_graph(data: bytes) -> list[GraphNode]:
    nodes: list[GraphNode] = []
    for number, value in fields(data):
        if number != 1:
            continue
        node = GraphNode()
        for node_field, node_value in fields(as_bytes(value)):
            if node_field == 1:
                child_id, local_name = -1, ""
                for ref_field, ref_value in fields(as_bytes(node_value)):
                    if ref_field == 1:
                        child_id = as_int(ref_value)
                    elif ref_field == 2:
                        local_name = as_bytes(ref_value).decode("utf-8", "replace")
                node.children.append((child_id, local_name))
            elif node_field == 2:
                name = full_name = key = ""
                for attr_field, attr_value in fields(as_bytes(node_value)):
                    text = as_bytes(attr_value).decode("utf-8", "replace")
                    if attr_field == 1:
                        name = text
                    elif attr_field == 2:
                        full_name = text
                    elif attr_field == 3:
                        key = text
                if name == "VARIABLE_VALUE" and key:
                    node.variable = (full_name, key)
        nodes.append(node)
    return nodes


def _is_optimizer(nodes: list[GraphNode], node_id: int, local_name: str) -> bool:
    if local_name == "optimizer":
        return True
    return bool(_OPTIMIZER_CHILDREN & {name for _child, name in nodes[node_id].children})


def _paths_avoiding_optimizer(nodes: list[GraphNode]) -> dict[int, str]:
    """node id -> the first path found breadth-first from the root, never entering an optimizer."""
    paths: dict[int, str] = {0: ""} if nodes else {}
    queue = deque([0] if nodes else [])
    while queue:
        parent = queue.popleft()
        for child, local_name in nodes[parent].children:
            if not 0 <= child < len(nodes) or child in paths or _is_optimizer(nodes, child, local_name):
                continue
            paths[child] = f"{paths[parent]}/{local_name}" if paths[parent] else local_name
            queue.append(child)
    return paths


def _without_export_copies(found: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """Keras' ``model.export`` stores each variable twice (``variables/N`` and
    ``_all_variables/M``, the same full name): keep the ``variables/N`` one."""
    elsewhere = {full for _n, full, key in found if not key.startswith("_all_variables/")}
    return [item for item in found if not (item[2].startswith("_all_variables/") and item[1] in elsewhere)]


def name_variables(nodes: list[GraphNode], keys: set[str]) -> list[NamedVariable]:
    """Every variable of the graph stored in the bundle, named and given a role, in graph order."""
    reachable = _paths_avoiding_optimizer(nodes)
    found: list[tuple[int, str, str]] = []  # (node, full name, key)
    seen_keys: set[str] = set()
    for node_id, node in enumerate(nodes):
        if node.variable is not None and node.variable[1] in keys and node.variable[1] not in seen_keys:
            seen_keys.add(node.variable[1])
            found.append((node_id, *node.variable))
    found = _without_export_copies(found)
    named: list[NamedVariable] = []
    for node_id, full, key in found:
        if key == "save_counter" + ATTRIBUTE_SUFFIX:
            named.append(NamedVariable(key, "save_counter", full, "counter"))
        elif node_id in reachable and reachable[node_id].startswith(_METRICS):
            named.append(NamedVariable(key, reachable[node_id], full, "metric"))
        elif node_id in reachable:
            named.append(NamedVariable(key, reachable[node_id], full, "model"))
        else:
            named.append(NamedVariable(key, full or key.removesuffix(ATTRIBUTE_SUFFIX), full, "optimizer"))
    return named
