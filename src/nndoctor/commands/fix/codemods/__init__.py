"""One codemod per catalog code: ``propose(ctx) -> (new source, title)`` or ``Uncertain``.

A codemod module declares ``CODE``, ``SAFE`` (False: the edit changes behaviour beyond the
bug, applied only with ``--unsafe-fixes``; ``UNSAFE_REASON`` says how) and ``propose``. It edits
only at the finding's place (or the one place the finding's evidence points to) and raises
``Uncertain`` rather than guess between places.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# code -> module under nndoctor.commands.fix.codemods
CODEMODS: dict[str, str] = {
    "D101": "scale_pixels",
    "D105": "shuffle_loader",
    "L101": "drop_softmax",
    "L102": "drop_sigmoid",
    "L103": "nll_to_cross_entropy",
    "O101": "add_zero_grad",
    "O102": "move_zero_grad",
    "O108": "divide_accumulated_loss",
    "M101": "eval_around_evaluation",
    "M102": "train_at_loop_start",
    "B101": "torch_bn_momentum",
    "C101": "save_unwrapped_state_dict",
    "C103": "save_state_dict",
    "C104": "weights_only",
    "O109": "adam_to_adamw",
    "R101": "seed_at_top",
    "P108": "detach_kept_loss",
    "K101": "keras_from_logits",
}


def codemod_for(code: str) -> ModuleType | None:
    name = CODEMODS.get(code)
    return importlib.import_module(f"{__name__}.{name}") if name else None
