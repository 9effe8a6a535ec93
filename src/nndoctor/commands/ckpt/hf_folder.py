"""A 🤗 Trainer checkpoint folder (``checkpoint-500/``) for ``ckpt inspect``.

The Trainer saves the weights (``model.safetensors`` or ``pytorch_model.bin``, possibly
sharded) beside its bookkeeping: ``trainer_state.json`` (global step, epoch, best metric,
log history), ``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``, ``training_args.bin``.
``ckpt inspect`` shows the weights as for any checkpoint and the bookkeeping as one line
per file; the pickles among them are not loaded (their size is enough to say what is there).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from nndoctor.commands.ckpt.render import human_count

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin")
_BOOKKEEPING = {
    "optimizer.pt": "optimizer state",
    "scheduler.pt": "learning-rate scheduler state",
    "scaler.pt": "GradScaler state",
    "training_args.bin": "TrainingArguments (pickled)",
}


@dataclass
class TrainerFolder:
    path: str
    weights: str | None
    lines: list[str] = field(default_factory=list)


def is_trainer_folder(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "trainer_state.json"))


def _trainer_state_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except (OSError, ValueError) as error:
        return f"trainer_state.json: unreadable ({error})"
    facts = [f"global_step={state.get('global_step')}", f"epoch={state.get('epoch')}"]
    if state.get("max_steps"):
        facts.append(f"max_steps={state['max_steps']}")
    if state.get("best_metric") is not None:
        facts.append(f"best_metric={state['best_metric']} ({state.get('best_model_checkpoint')})")
    history = state.get("log_history") or []
    facts.append(f"log_history: {len(history)} entries")
    last_loss = next((entry["loss"] for entry in reversed(history) if "loss" in entry), None)
    if last_loss is not None:
        facts.append(f"last logged loss={last_loss}")
    return "trainer_state.json: " + ", ".join(facts)


def _size(path: str) -> str:
    return human_count(os.path.getsize(path)) + "B"


def describe(path: str) -> TrainerFolder:
    names = sorted(os.listdir(path))
    weights = next((os.path.join(path, n) for n in WEIGHT_FILES if n in names and not n.endswith(".json")), None)
    shards = [n for n in names if n.endswith(".index.json")]
    folder = TrainerFolder(path=path, weights=weights)
    folder.lines.append(_trainer_state_line(os.path.join(path, "trainer_state.json")))
    if weights is None and shards:
        folder.lines.append(f"{shards[0]}: sharded weights (inspect each shard file)")
    for name in names:
        full = os.path.join(path, name)
        if name in _BOOKKEEPING:
            folder.lines.append(f"{name}: {_BOOKKEEPING[name]}, {_size(full)}")
    rng = [n for n in names if n.startswith("rng_state")]
    if rng:
        folder.lines.append(f"{', '.join(rng)}: random-number generator states (python, numpy, torch) "
                            "for resuming exactly")
    return folder
