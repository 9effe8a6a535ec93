"""Explanations of saving/loading crashes: E106 state_dict keys, E107 wrapper attributes, E126
weights-only load refused."""

from __future__ import annotations

import inspect
import re
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation
from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.evidence import live_objects
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register

WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _key_list(text: str) -> list[str]:
    return re.findall(r'"([^"]+)"', text)


def parse_state_dict_error(message: str) -> dict[str, Any]:
    """Missing keys, unexpected keys and size mismatches listed by ``load_state_dict`` (pure)."""
    missing = re.search(r"Missing key\(s\) in state_dict: (.*?)(?:\.\s*\n|\.\s*$)", message, re.S)
    unexpected = re.search(r"Unexpected key\(s\) in state_dict: (.*?)(?:\.\s*\n|\.\s*$)", message, re.S)
    sizes = re.findall(
        r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) from checkpoint, "
        r"the shape in current model is torch\.Size\(\[([\d, ]*)\]\)", message)
    model = re.search(r"Error\(s\) in loading state_dict for (\w+)", message)
    return {
        "model": model.group(1) if model else None,
        "missing": _key_list(missing.group(1)) if missing else [],
        "unexpected": _key_list(unexpected.group(1)) if unexpected else [],
        "size_mismatch": [(name, saved, current) for name, saved, current in sizes],
    }


def common_prefix_chain(keys: list[str]) -> str:
    """The wrapper prefix chain (``module.``, ``_orig_mod.``, repeated) every key starts with."""
    prefix = ""
    while keys:
        for candidate in WRAPPER_PREFIXES:
            if all(k.startswith(prefix + candidate) for k in keys):
                prefix += candidate
                break
        else:
            break
    return prefix


def prefix_diagnosis(missing: list[str], unexpected: list[str]) -> tuple[str, str] | None:
    """(direction, prefix): ``"saved"`` when the checkpoint's keys carry a wrapper prefix the
    model lacks, ``"model"`` when the model is wrapped and the checkpoint is not (pure)."""
    saved_prefix = common_prefix_chain(unexpected)
    if saved_prefix and unexpected:
        stripped = {k[len(saved_prefix):] for k in unexpected}
        if not missing or set(missing) <= stripped or stripped & set(missing):
            return "saved", saved_prefix
    model_prefix = common_prefix_chain(missing)
    if model_prefix and missing:
        stripped = {k[len(model_prefix):] for k in missing}
        if not unexpected or stripped & set(unexpected):
            return "model", model_prefix
    return None


@register
class StateDictKeyMismatch(CrashExplanation):
    """
    ## What it does
    Explains ``load_state_dict`` errors — "Missing key(s)", "Unexpected key(s) in state_dict:
    "module.conv1.weight"", "size mismatch for fc.weight": recognises a wrapper prefix on the
    saved keys (``module.`` from DataParallel/DDP, ``_orig_mod.`` from ``torch.compile``) or on
    the model, and a head of another size, and gives the exact one-line fix.

    ## Why is this bad?
    A checkpoint saved from ``nn.DataParallel(model)`` has every key prefixed with
    ``module.`` and does not load into the plain model; one saved by a
    compiled model has ``_orig_mod.``. A classifier fine-tuned for another number of classes
    has a differently sized head.

    ## Example
    ```python
    torch.save(nn.DataParallel(net).state_dict(), "ckpt.pt")
    net.load_state_dict(torch.load("ckpt.pt"))
    ```

    ## Use instead
    ```python
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
    state = torch.load("ckpt.pt")
    consume_prefix_in_state_dict_if_present(state, "module.")
    net.load_state_dict(state)
    ```
    and save ``model.module.state_dict()`` in the first place (C101).

    ## References
    - PyTorch docs, ``consume_prefix_in_state_dict_if_present``.
    """

    code = "E106"
    name = "state-dict-key-mismatch"
    summary = "a state_dict does not fit the model (wrapper prefix, renamed layers or resized head)"
    fix = "strip the wrapper prefix (consume_prefix_in_state_dict_if_present(sd, 'module.')) or load into the matching model"
    patterns = (r"Error\(s\) in loading state_dict", r"Missing key\(s\) in state_dict", r"Unexpected key\(s\) in state_dict")
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        parsed = parse_state_dict_error(crash.message)
        missing, unexpected, sizes = parsed["missing"], parsed["unexpected"], parsed["size_mismatch"]
        evidence: dict[str, Any] = {"missing_count": len(missing), "unexpected_count": len(unexpected),
                                    "missing": missing[:3], "unexpected": unexpected[:3]}
        target = parsed["model"] or "the model"
        diagnosis = prefix_diagnosis(missing, unexpected)
        fix = cls.fix
        if diagnosis and diagnosis[0] == "saved":
            prefix = diagnosis[1]
            origin = ("a DataParallel/DistributedDataParallel wrapper" if prefix.startswith("module.")
                      else "a torch.compile'd model")
            evidence["saved_prefix"] = prefix
            message = (f"The checkpoint was saved from {origin}: all {len(unexpected)} keys start with "
                       f"'{prefix}' (\"{unexpected[0]}\"), while {target} expects \"{unexpected[0][len(prefix):]}\".")
            parts = [p + "." for p in prefix.rstrip(".").split(".")]
            consume = "; ".join(f"consume_prefix_in_state_dict_if_present(state_dict, {p!r})" for p in parts)
            fix = (f"strip the prefix before loading: `{consume}` (from torch.nn.modules.utils); "
                   "next time save `model.module.state_dict()`")
        elif diagnosis and diagnosis[0] == "model":
            prefix = diagnosis[1]
            evidence["model_prefix"] = prefix
            message = (f"{target} is wrapped (its keys start with '{prefix}', e.g. \"{missing[0]}\") but the "
                       "checkpoint was saved from the plain model.")
            attribute = prefix.rstrip(".").replace(".", ".")
            fix = f"load into the wrapped model: `model.{attribute}.load_state_dict(state_dict)`"
        elif sizes:
            evidence["size_mismatch"] = {n: {"checkpoint": s, "model": c} for n, s, c in sizes[:6]}
            name, saved, current = sizes[0]
            message = (f"{len(sizes)} parameter(s) have another shape in the checkpoint than in {target}: "
                       f"{name} is [{saved}] saved vs [{current}] now.")
            heads = [n for n, _, _ in sizes]
            if all(n.rsplit(".", 2)[0] == heads[0].rsplit(".", 2)[0] for n in heads):
                message += " Only one layer differs: typically a classifier head for another number of classes."
                fix = (f"drop the mismatched keys ({', '.join(heads[:2])}) from the state_dict and load with "
                       "strict=False, then check that only those keys are reported missing")
            else:
                fix = "build the model with the same configuration (sizes, number of classes) as the checkpoint"
        else:
            message = (f"The checkpoint and {target} have different keys: {len(missing)} missing, "
                       f"{len(unexpected)} unexpected (renamed or added layers, or another architecture).")
            fix = "load into the architecture that saved the file, or rename the keys; `nndoctor ckpt diff` compares them"
        return cls.make(crash, message, fix=fix, evidence=evidence)


WRAPPER_TYPES = ("DataParallel", "DistributedDataParallel", "FullyShardedDataParallel", "OptimizedModule")


@register
class WrapperAttributeError(CrashExplanation):
    """
    ## What it does
    Explains "'DataParallel' object has no attribute 'fc'": the attribute belongs to the
    wrapped model, reachable as ``model.module.fc``; on a live run it checks that
    ``model.module`` really has it.

    ## Why is this bad?
    ``nn.DataParallel``/``DistributedDataParallel`` wrap the model; its own attributes and
    methods are one level down.

    ## Example
    ```python
    model = nn.DataParallel(net)
    model.fc = nn.Linear(512, 10)       # sets it on the wrapper
    model.set_fix_method()              # AttributeError
    ```

    ## Use instead
    ```python
    model.module.set_fix_method()
    ```

    ## References
    - PyTorch docs, `DataParallel` (the wrapped model is `.module`): https://pytorch.org/docs/stable/generated/torch.nn.DataParallel.html
    - PyTorch docs, `DistributedDataParallel`: https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
    """

    code = "E107"
    name = "wrapper-attribute-error"
    summary = "an attribute of the model looked up on its DataParallel/DDP wrapper"
    fix = "reach the wrapped model through .module: model.module.<attribute>"
    patterns = (r"'(?P<wrapper>" + "|".join(WRAPPER_TYPES) + r")' object has no attribute '(?P<attribute>\w+)'",)
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        wrapper, attribute = facts["wrapper"], facts["attribute"]
        evidence: dict[str, Any] = {"wrapper": wrapper, "attribute": attribute}
        variable = "model"
        confirmed = None
        if crash.is_live:
            for name, value in live_objects(crash, lambda v: type(v).__name__ == wrapper):
                variable = name if name != "self" else variable
                inner = getattr(value, "module", None)
                if inner is not None:
                    try:
                        found = inspect.getattr_static(inner, attribute)
                    except AttributeError:
                        found = inspect.getattr_static(inner, "_modules", {}).get(attribute)
                    confirmed = found is not None
                    if confirmed:
                        evidence["inner_type"] = type(inner).__name__
                break
        message = f"`{attribute}` is an attribute of the model inside the {wrapper} wrapper, not of the wrapper itself."
        if confirmed:
            message += f" `{variable}.module.{attribute}` exists ({evidence['inner_type']})."
        elif confirmed is False:
            message = (f"Neither the {wrapper} wrapper nor the model inside it has an attribute `{attribute}`.")
        fix = f"use `{variable}.module.{attribute}`" if confirmed is not False else "check the attribute name on the wrapped model"
        return cls.make(crash, message, fix=fix, evidence=evidence)


@register
class WeightsOnlyLoadRefused(CrashExplanation):
    """
    ## What it does
    Explains "Weights only load failed … Unsupported global: GLOBAL numpy._core.multiarray._reconstruct":
    ``torch.load`` (``weights_only=True`` by default since PyTorch 2.6) refused a checkpoint
    that holds numpy arrays or custom classes. Names the refused globals and the safe ways to
    load the file.

    ## Why is this bad?
    Older training scripts saved numpy arrays (normalisation statistics, metrics), argparse
    Namespaces or their own classes in the checkpoint. Loading them needs either trust
    (``weights_only=False`` runs arbitrary code from the file) or an explicit allow-list.

    ## Example
    ```python
    torch.save({"model": net.state_dict(), "mean": np.array([0.5, 0.5, 0.5])}, "ckpt.pt")
    torch.load("ckpt.pt")            # UnpicklingError: Weights only load failed
    ```

    ## Use instead
    ```python
    with torch.serialization.safe_globals([np._core.multiarray._reconstruct, np.ndarray, np.dtype]):
        ckpt = torch.load("ckpt.pt")
    # or, only for a file you trust: torch.load("ckpt.pt", weights_only=False)
    # and save tensors/lists instead of numpy arrays from now on
    ```

    ## References
    - PyTorch docs, ``torch.load`` and ``torch.serialization.add_safe_globals``.
    """

    code = "E126"
    name = "weights-only-load-refused"
    summary = "torch.load(weights_only=True) refused globals (numpy arrays, custom classes) in the file"
    fix = "allow the listed globals with torch.serialization.safe_globals([...]) or, for a trusted file only, weights_only=False"
    patterns = (r"Weights only load failed", r"Unsupported global: GLOBAL (?P<global>[\w.]+)")
    # The unpickler's own line (torch/_weights_only_unpickler.py), pasted without the
    # UnpicklingError line above it.
    log_lines = (r"WeightsUnpickler error: Unsupported global: GLOBAL [\w.]+ was not an allowed global",)
    order = 20

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        refused = sorted(set(re.findall(r"GLOBAL ([\w.]+) was not an allowed global", crash.message)))
        evidence: dict[str, Any] = {"globals": refused}
        path = None
        if crash.is_live:
            found = crash.frame_locals("load", "serialization")
            value = found.get("f") if found else None
            if isinstance(value, (str, bytes)) or hasattr(value, "__fspath__"):
                path = str(value)
                evidence["file"] = path
        numpy = [g for g in refused if g.startswith("numpy")]
        message = "torch.load (weights_only=True, the default since PyTorch 2.6) refused "
        message += f"{path}" if path else "the checkpoint"
        message += f": it holds {', '.join(refused) or 'objects other than tensors'}"
        message += " (numpy arrays)" if numpy else ""
        message += ", which the safe loader does not allow by default."
        if refused:
            names = ", ".join(refused)
            fix = (f"if you trust the file: `with torch.serialization.safe_globals([{names}]): torch.load(...)`"
                   + (" (numpy arrays usually also need numpy.ndarray and numpy.dtype)" if numpy else "")
                   + "; or `torch.load(..., weights_only=False)` — runs code from the file, trusted sources only")
        else:
            fix = cls.fix
        return cls.make(crash, message, fix=fix, evidence=evidence)
