"""Saving and loading state: C101 wrapper prefixes, C102 non-strict loads, C103 whole-model pickles."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from nndoctor.core.events import CheckpointSave, StateDictLoad
from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register

WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def find_state_dicts(obj: Any, depth: int = 0) -> list[tuple[str, Mapping]]:
    """Mappings of str -> tensor inside a checkpoint object (top level or one container down)."""
    found: list[tuple[str, Mapping]] = []
    if isinstance(obj, Mapping) and obj:
        if all(isinstance(k, str) for k in obj) and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return [("", obj)]
        if depth < 2:
            for key, value in obj.items():
                for where, sd in find_state_dicts(value, depth + 1):
                    found.append((f"{key}.{where}" if where else str(key), sd))
    return found


def common_wrapper_prefix(keys: list[str]) -> str | None:
    """The wrapper prefix (``module.`` / ``_orig_mod.``, possibly repeated) carried by every key."""
    if not keys:
        return None
    prefix = ""
    remaining = keys
    while True:
        for candidate in WRAPPER_PREFIXES:
            if all(k.startswith(candidate) for k in remaining):
                prefix += candidate
                remaining = [k[len(candidate):] for k in remaining]
                break
        else:
            return prefix or None


@register
class WrapperPrefixInCheckpoint(Check):
    """
    ## What it does
    Flags ``torch.save`` of a state_dict whose every key starts with a wrapper prefix:
    ``module.`` (``nn.DataParallel`` / ``DistributedDataParallel``) or ``_orig_mod.``
    (``torch.compile``).

    ## Why is this bad?
    The checkpoint only loads into the same wrapper. Loading it into the plain model fails
    with "Missing key(s) … Unexpected key(s) in state_dict: module.conv1.weight" — or,
    with ``strict=False``, silently loads nothing.

    ## Example
    ```python
    model = nn.DataParallel(net)
    torch.save(model.state_dict(), "ckpt.pt")
    ```

    ## Use instead
    ```python
    torch.save(model.module.state_dict(), "ckpt.pt")     # DataParallel / DDP
    torch.save(model._orig_mod.state_dict(), "ckpt.pt")  # torch.compile
    ```
    An existing checkpoint can be repaired with ``nndoctor ckpt fix ckpt.pt -o fixed.pt`` or
    ``torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, "module.")``.

    ## References
    - PyTorch tutorial, "Saving and loading models" (DataParallel): https://pytorch.org/tutorials/beginner/saving_loading_models.html
    """

    code = "C101"
    name = "wrapper-prefix-in-checkpoint"
    severity = Severity.WARNING
    summary = "state_dict saved with module. / _orig_mod. wrapper prefixes"
    fix = "save model.module.state_dict() (DataParallel/DDP) or model._orig_mod.state_dict() (torch.compile)"

    def on_checkpoint_save(self, event: CheckpointSave) -> None:
        for where, sd in find_state_dicts(event.obj):
            prefix = common_wrapper_prefix(list(sd.keys()))
            if prefix:
                self.report(
                    f"torch.save writes a state_dict{f' (under {where!r})' if where else ''} whose "
                    f"{len(sd)} keys all start with {prefix!r}: it will not load into the unwrapped model.",
                    location=event.location,
                    evidence={"prefix": prefix, "keys": len(sd), "example_key": next(iter(sd)),
                              "path": event.path},
                    step=event.step,
                )
                return


@register
class NonStrictLoadDroppedKeys(Check):
    """
    ## What it does
    Reports what ``load_state_dict(strict=False)`` silently skipped: the model's keys that
    got no value (missing) and the checkpoint's keys that went nowhere (unexpected). It is
    an error when more than half of the model's keys were not loaded.

    ## Why is this bad?
    ``strict=False`` is often added to silence a key mismatch — and then loads nothing: a
    ``module.`` prefix, a renamed scope or another architecture leaves the model at its
    random initialisation while training "resumes". Loading a backbone into a
    model with a new head is the legitimate use; it is reported as info only, listing the
    skipped keys so you can confirm them.

    ## Example
    ```python
    model.load_state_dict(torch.load("dp_ckpt.pt"), strict=False)  # keys are module.*
    ```

    ## Use instead
    ```python
    result = model.load_state_dict(state_dict, strict=False)
    assert not result.missing_keys, result.missing_keys
    ```
    or repair the keys first (``nndoctor ckpt diff``/``fix``).

    ## References
    - PyTorch docs, ``Module.load_state_dict``: https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.load_state_dict
    """

    code = "C102"
    name = "non-strict-load-dropped-keys"
    severity = Severity.ERROR
    summary = "load_state_dict(strict=False) silently skipped keys"
    fix = "fix the key names (strip the prefix, rename) and load with strict=True, or assert on the returned missing_keys"

    def on_state_dict_load(self, event: StateDictLoad) -> None:
        if event.strict or not (event.missing or event.unexpected):
            return
        total = max(1, len(event.model_keys))
        fraction = len(event.missing) / total
        severity = Severity.ERROR if fraction > 0.5 else Severity.INFO
        hint = ""
        prefix = common_wrapper_prefix(list(event.unexpected)) if event.unexpected else None
        if prefix:
            hint = f" The checkpoint's keys carry the wrapper prefix {prefix!r}; strip it."
        self.report(
            f"load_state_dict(strict=False) into {type(event.module).__name__} left {len(event.missing)} of "
            f"{total} model keys unloaded ({fraction:.0%}) and ignored {len(event.unexpected)} checkpoint "
            f"keys (e.g. missing {event.missing[:2]}, unexpected {event.unexpected[:2]}).{hint}",
            location=event.location,
            evidence={"missing": event.missing, "unexpected": event.unexpected,
                      "missing_fraction": round(fraction, 3)},
            severity=severity, step=event.step,
        )


@register
class WholeModelPickle(Check):
    """
    ## What it does
    Flags ``torch.save`` of an ``nn.Module`` object (or a dict holding one) instead of its
    ``state_dict()``.

    ## Why is this bad?
    The file is a pickle of your classes: it only loads where the same code sits at the
    same import path, breaks when you rename or move a class, and loading it needs
    ``weights_only=False`` — which executes arbitrary code from the file.
    Since PyTorch 2.6 ``torch.load`` refuses it by default.

    ## Example
    ```python
    torch.save(model, "model.pt")
    ```

    ## Use instead
    ```python
    torch.save(model.state_dict(), "model.pt")
    model = Net(); model.load_state_dict(torch.load("model.pt"))
    ```

    ## References
    - PyTorch tutorial, "Saving and loading models": https://pytorch.org/tutorials/beginner/saving_loading_models.html
    - PyTorch docs, ``torch.load`` weights_only: https://pytorch.org/docs/stable/generated/torch.load.html
    """

    code = "C103"
    name = "whole-model-pickle"
    severity = Severity.WARNING
    summary = "torch.save(model) instead of its state_dict"
    fix = "save model.state_dict() and rebuild the model from code when loading"

    def on_checkpoint_save(self, event: CheckpointSave) -> None:
        obj = event.obj
        modules = []
        if isinstance(obj, torch.nn.Module):
            modules.append(("", obj))
        elif isinstance(obj, Mapping):
            modules = [(str(k), v) for k, v in obj.items() if isinstance(v, torch.nn.Module)]
        if not modules:
            return
        where, module = modules[0]
        self.report(
            f"torch.save pickles the whole {type(module).__name__} object"
            f"{f' (under key {where!r})' if where else ''} instead of its state_dict: loading it needs the "
            "same code at the same import path and weights_only=False.",
            location=event.location,
            evidence={"class": f"{type(module).__module__}.{type(module).__qualname__}", "path": event.path},
            step=event.step,
        )
