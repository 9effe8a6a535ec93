"""``--try``: measure a change instead of guessing its effect.

``loader`` rebuilds the user's DataLoader (same dataset, batch size, collate function)
with other worker/pinning/prefetch settings and times each for a few seconds; the best few
of that grid are then timed end to end (loading, the copy to the device and the user's
training step on a copy of the model), which decides the advice: pinned memory and the
CPU cores the main process needs only show there. The step changes (``amp``,
``channels_last``, ``compile``, ``cudnn-benchmark``, ``tf32``, ``fused-optimizer``, ``sdpa``,
``cuda-graphs``, ``batch-size``, and under torchrun DDP's ``ddp-bucket-view``, ``ddp-static-graph``,
``ddp-bucket-cap``, ``ddp-no-sync``; ``ddp`` names all four) are measured on the user's own loop, re-run with the change
injected: see ``rerun.py`` and ``inject.py``. On Keras/TensorFlow the changes are ``prefetch``,
``parallel-map`` and ``mixed-precision`` (``tf_inject.py``, ``tf_trials.py``).

Trials run after the measured window, on copies: the user's model, optimizer and RNG
streams are left as they were (``torch.random.fork_rng``).
"""

from __future__ import annotations

# DistributedDataParallel's own settings, under torchrun (perf/torch/ddp_trials.py): every rank's
# re-run gets the change in its DistributedDataParallel(...) call.
DDP_TRIALS = ("ddp-bucket-view", "ddp-static-graph", "ddp-bucket-cap", "ddp-no-sync")
STEP_TRIALS = ("amp", "channels_last", "compile", "cudnn-benchmark", "tf32", "fused-optimizer", "sdpa",
               "cuda-graphs", "batch-size", *DDP_TRIALS)
# Keras/TensorFlow changes (perf/tf/inject.py); ``amp`` means mixed-precision there.
TF_TRIALS = ("prefetch", "parallel-map", "mixed-precision")
ALL_TRIALS = ("loader", *STEP_TRIALS, *TF_TRIALS)
# What a PyTorch change asked of a TensorFlow script would be there (and the reverse).
TORCH_EQUIVALENTS = {"loader": "for a tf.data pipeline try prefetch and parallel-map",
                     "compile": "Keras compiles fit's step already (jit_compile=True adds XLA)",
                     "channels_last": "Keras sets the layout per layer (data_format)"}
TF_EQUIVALENTS = {"prefetch": "for a DataLoader try loader (workers, pinned memory, prefetch_factor)",
                  "parallel-map": "for a DataLoader try loader (num_workers)",
                  "mixed-precision": "on PyTorch try amp (autocast)"}


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
                    "fused": "fused-optimizer", "mixed": "mixed-precision", "map": "parallel-map",
                    "ddp": "ddp-all"}.get(part, part)
            if part == "ddp-all":  # --try ddp: every DDP setting
                names.extend(DDP_TRIALS)
                continue
            if part not in ALL_TRIALS:
                raise ValueError(f"unknown --try {part!r} (choose from {', '.join(ALL_TRIALS)}, all)")
            names.append(part)
    return tuple(dict.fromkeys(names))
