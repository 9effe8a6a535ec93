"""``--try``: measure a change instead of guessing its effect.

``loader`` rebuilds the user's DataLoader (same dataset, batch size, collate function)
with other worker/pinning/prefetch settings and times each for a few seconds; the best few
of that grid are then timed end to end (loading, the copy to the device and the user's
training step on a copy of the model), which decides the advice: pinned memory and the
CPU cores the main process needs only show there. The step changes (``amp``,
``channels_last``, ``compile``, ``cudnn-benchmark``, ``tf32``, ``fused-optimizer``, ``sdpa``,
``cuda-graphs``, ``batch-size``) are measured on the user's own loop, re-run with the change
injected: see ``rerun.py`` and ``inject.py``.

Trials run after the measured window, on copies: the user's model, optimizer and RNG
streams are left as they were (``torch.random.fork_rng``).
"""

from __future__ import annotations

STEP_TRIALS = ("amp", "channels_last", "compile", "cudnn-benchmark", "tf32", "fused-optimizer", "sdpa",
               "cuda-graphs", "batch-size")
ALL_TRIALS = ("loader", *STEP_TRIALS)


def parse_tries(values: list[str] | None) -> tuple[str, ...]:
    names: list[str] = []
    for value in values or []:
        for part in value.split(","):
            part = part.strip().replace("_", "-").lower()
            if not part:
                continue
            if part == "all":
                names.extend(ALL_TRIALS)
                continue
            part = {"channels-last": "channels_last", "cudagraphs": "cuda-graphs", "batch": "batch-size",
                    "fused": "fused-optimizer"}.get(part, part)
            if part not in ALL_TRIALS:
                raise ValueError(f"unknown --try {part!r} (choose from {', '.join(ALL_TRIALS)}, all)")
            names.append(part)
    return tuple(dict.fromkeys(names))
