"""Training-loop bookkeeping in a checkpoint, summarised for ``ckpt inspect``.

A Lightning checkpoint holds ~70 loop-progress counters (``loops.fit_loop.…``), each
callback's state and each scheduler's fields; a 🤗 Trainer folder's files hold scheduler and
RNG states. People inspecting a checkpoint want the weights and a line per bookkeeping
item: epochs and steps done, the callbacks' key values, each optimizer and scheduler.
"""

from __future__ import annotations

import re

_GROUP_SIZE_SHOWN = 3  # groups up to this size are listed entry by entry
_LINE_LIMIT = 160


def _group_of(key: str) -> str:
    parts = key.split(".")
    if parts[0] == "loops" or len(parts) < 3:
        return parts[0]
    # callbacks.ModelCheckpoint{'monitor': None, …}.best_model_path -> callbacks.ModelCheckpoint
    head = re.sub(r"\{.*\}$", "", ".".join(parts[:2])) if "{" not in key else None
    if head is None:
        match = re.match(r"^([^.]+)\.([^.{]+)", key)
        head = f"{match.group(1)}.{match.group(2)}" if match else parts[0]
    return head


def _leaf(key: str, group: str) -> str:
    rest = key[len(group):] if key.startswith(group) else key
    rest = re.sub(r"^\{.*?\}", "", rest)  # the callback's state key
    return rest.lstrip(".") or key


def _loops_line(entries: dict[str, str]) -> str:
    def value(key: str) -> str | None:
        return entries.get(key)

    facts = []
    epochs = value("loops.fit_loop.epoch_progress.current.completed")
    batches = value("loops.fit_loop.epoch_loop.batch_progress.total.completed")
    if epochs is not None:
        facts.append(f"fit epochs completed {epochs}")
    if batches is not None:
        facts.append(f"training batches {batches}")
    for loop in ("validate_loop", "test_loop", "predict_loop"):
        done = value(f"loops.{loop}.batch_progress.total.completed")
        if done not in (None, "0"):
            facts.append(f"{loop.split('_')[0]} batches {done}")
    detail = "; ".join(facts) if facts else "loop progress counters"
    return f"loops: Lightning loop progress, {len(entries)} counters ({detail})"


def _clip(line: str) -> str:
    return line if len(line) <= _LINE_LIMIT else line[: _LINE_LIMIT - 1] + "…"


def bookkeeping_lines(other_entries: dict[str, str]) -> list[str]:
    """One line per bookkeeping item; small groups keep their entries."""
    groups: dict[str, dict[str, str]] = {}
    for key, summary in other_entries.items():
        groups.setdefault(_group_of(key), {})[key] = summary
    lines = []
    for group, entries in groups.items():
        if group == "loops" and len(entries) > _GROUP_SIZE_SHOWN:
            lines.append(_loops_line(entries))
        elif len(entries) <= _GROUP_SIZE_SHOWN:
            lines += [_clip(f"{key}: {summary}") for key, summary in entries.items()]
        else:
            shown = ", ".join(f"{_leaf(k, group)}={v}" for k, v in entries.items())
            lines.append(_clip(f"{group}: {shown}"))
    return lines
