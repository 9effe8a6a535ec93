"""Tracing a data error to samples: re-fetch the failing batch's items one by one.

Runs on the crash path only. The indices come from the note the crash instrumentation
attached (``explain.instrument``); the dataset from the DataLoader found in the traceback's
frames. Random transforms draw from the global RNGs, so their states are saved and restored
around the re-fetch: the user's random streams are left exactly as the crash left them.
"""

from __future__ import annotations

import ast
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.instrument import ATTRIBUTE, NOTE_PREFIX

MAX_ITEMS = 64
TIME_BUDGET_S = 5.0


@dataclass
class ItemProbe:
    """One re-fetched item: its index, the shape of each component, its file, or its error."""

    index: Any
    shapes: list[str] = field(default_factory=list)
    path: str | None = None
    error: str | None = None


def batch_indices(crash: Crash) -> list[Any] | None:
    """The failing batch's dataset indices: from the live exception, else from the note text."""
    if crash.error is not None:
        found = getattr(crash.error, ATTRIBUTE, None)
        if found is not None:
            return list(found)
    return indices_from_text(crash.message)


def indices_from_text(text: str) -> list[Any] | None:
    match = re.search(re.escape(NOTE_PREFIX) + r"(\[[^\]]*\])", text)
    if not match:
        return None
    try:
        value = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return None
    return list(value) if isinstance(value, (list, tuple)) else None


def find_dataset(crash: Crash) -> Any:
    """The dataset behind the failing DataLoader, from the traceback's live frames."""
    for frame in reversed(crash.live_frames()):
        owner = frame.f_locals.get("self")
        for attribute in ("_dataset", "dataset"):
            dataset = getattr(owner, attribute, None) if owner is not None else None
            if dataset is not None and hasattr(dataset, "__getitem__"):
                return dataset
    return None


def sample_path(dataset: Any, index: Any) -> str | None:
    """The file behind an item of an ImageFolder-like dataset (``samples``/``imgs``), through
    ``Subset`` wrappers."""
    for _ in range(8):
        indices = getattr(dataset, "indices", None)
        inner = getattr(dataset, "dataset", None)
        if indices is not None and inner is not None:
            try:
                index = indices[index]
            except Exception:  # noqa: BLE001
                return None
            dataset = inner
            continue
        break
    for attribute in ("samples", "imgs"):
        samples = getattr(dataset, attribute, None)
        if samples is None:
            continue
        try:
            entry = samples[index]
        except Exception:  # noqa: BLE001
            return None
        if isinstance(entry, (list, tuple)) and entry and isinstance(entry[0], str):
            return entry[0]
        if isinstance(entry, str):
            return entry
    return None


def describe_component(value: Any) -> str:
    """A short shape description of one component of an item."""
    shape = getattr(value, "shape", None)
    if shape is not None and not callable(shape):
        return "[" + ", ".join(str(int(s)) for s in shape) + "]"
    size, mode = getattr(value, "size", None), getattr(value, "mode", None)
    if isinstance(size, tuple) and isinstance(mode, str):  # a PIL image: W×H and mode
        return f"PIL {mode} {size[0]}x{size[1]}"
    return type(value).__name__


def components(item: Any) -> list[Any]:
    if isinstance(item, (list, tuple)):
        return list(item)
    if isinstance(item, dict):
        return list(item.values())
    return [item]


class _PreservedRandomState:
    """Save and restore the global RNGs that random transforms draw from."""

    def __enter__(self) -> _PreservedRandomState:
        import torch

        self.torch_state = torch.get_rng_state()
        self.python_state = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy_state = numpy.random.get_state() if numpy is not None else None
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        torch.set_rng_state(self.torch_state)
        random.setstate(self.python_state)
        numpy = sys.modules.get("numpy")
        if numpy is not None and self.numpy_state is not None:
            numpy.random.set_state(self.numpy_state)


def probe_items(dataset: Any, indices: list[Any], *, limit: int = MAX_ITEMS,
                budget_s: float = TIME_BUDGET_S) -> list[ItemProbe]:
    """Fetch each index alone; record its component shapes or the error it raises."""
    probes: list[ItemProbe] = []
    started = time.perf_counter()
    with _PreservedRandomState():
        for index in indices[:limit]:
            if time.perf_counter() - started > budget_s:
                break
            probe = ItemProbe(index=index, path=sample_path(dataset, index))
            try:
                item = dataset[index]
                probe.shapes = [describe_component(c) for c in components(item)]
            except Exception as error:  # noqa: BLE001 - the failing item is the evidence
                probe.error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            probes.append(probe)
    return probes


def odd_items(probes: list[ItemProbe], component: int = 0) -> tuple[str | None, list[ItemProbe]]:
    """The majority shape of one component and the items that differ from it (or fail)."""
    shapes = [p.shapes[component] for p in probes if p.error is None and len(p.shapes) > component]
    if not shapes:
        return None, [p for p in probes if p.error is not None]
    majority, _ = Counter(shapes).most_common(1)[0]
    odd = [p for p in probes if p.error is not None or (len(p.shapes) > component and p.shapes[component] != majority)]
    return majority, odd


def describe_probe(probe: ItemProbe, component: int = 0) -> str:
    where = f" ({probe.path})" if probe.path else ""
    if probe.error:
        return f"index {probe.index}{where} raised {probe.error}"
    shape = probe.shapes[component] if len(probe.shapes) > component else "?"
    return f"index {probe.index}{where} is {shape}"
