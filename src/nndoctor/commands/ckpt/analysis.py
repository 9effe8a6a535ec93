"""Turning what was read (Checkpoint, KeyMapping) into findings. No I/O here."""

from __future__ import annotations

import sys

from nndoctor.commands.ckpt import checks
from nndoctor.commands.ckpt.checkpoint import Checkpoint, StateDict
from nndoctor.commands.ckpt.mapping import KeyMapping, class_counts
from nndoctor.commands.ckpt.pickle_scan import is_dangerous
from nndoctor.commands.ckpt.prefixes import (
    keys_with_infix_compile_wrapper,
    leading_wrapper_prefix,
    partial_wrapper_keys,
    wrappers_named,
)
from nndoctor.commands.ckpt.shared_codes import shared_finding
from nndoctor.core.findings import Finding, Location, Severity

_LISTED = 8


def _some(keys: list[str]) -> str:
    shown = ", ".join(keys[:_LISTED])
    return shown + (f", … (+{len(keys) - _LISTED})" if len(keys) > _LISTED else "")


def _where(sd: StateDict) -> str:
    return f"state dict '{sd.where}'" if sd.where else "state dict"


def safety_findings(ckpt: Checkpoint) -> list[Finding]:
    """C104 for any global outside the allowlist (always an error), C103 for pickled nn.Modules."""
    findings: list[Finding] = []
    if ckpt.unsafe_globals:
        dangerous = [g for g in ckpt.unsafe_globals if is_dangerous(g)]
        status = {
            "placeholders": "it was NOT loaded: nndoctor read it with inert placeholders, nothing was executed",
            "weights_only": "it was NOT loaded: nndoctor read it with inert placeholders, nothing was executed",
            "trusted": "it was loaded with --trust (pickle code was allowed to run)",
            "not-loaded": "it was NOT loaded (nothing was executed)",
        }.get(ckpt.read_mode, "")
        named = dangerous + [g for g in ckpt.unsafe_globals if g not in dangerous]
        message = (f"the pickle names {len(ckpt.unsafe_globals)} global(s) outside the allowlist of "
                   f"tensor and container rebuild functions: {_some(named)} — loading it with "
                   f"torch.load(weights_only=False), pickle.load or numpy.load(allow_pickle=True) "
                   f"imports and calls them, which can run any code; {status}")
        findings.append(shared_finding(
            "C104", message, path=ckpt.path, severity=Severity.ERROR,
            evidence={"unsafe_globals": ckpt.unsafe_globals, "dangerous_globals": dangerous,
                      "read_mode": ckpt.read_mode},
            fix=("do not load this file with weights_only=False; if you did not create it, delete it"
                 if dangerous else
                 "if you created the file: re-save only tensors (nndoctor ckpt fix IN -o OUT.safetensors); "
                 "otherwise do not load it with weights_only=False"),
        ))
    for where in ckpt.whole_model_at:
        sd = ckpt.find(where)
        classes = [g for g in ckpt.unsafe_globals if ".nn.modules." in g or g.startswith("__main__.")]
        findings.append(shared_finding(
            "C103",
            f"{'entry ' + repr(where) if where else 'the file'} is a pickled nn.Module "
            f"(torch.save(model)), not a state_dict: loading it needs the exact class code at its "
            f"import path and runs pickle; {len(sd.tensors) if sd else 0} tensors recovered "
            f"without executing it",
            path=ckpt.path,
            evidence={"where": where or "(root)", "classes": classes[:_LISTED]},
            fix="save model.state_dict(); 'nndoctor ckpt fix IN -o OUT.safetensors' extracts the "
                "state dict without running the pickle",
        ))
    return findings


def prefix_findings(ckpt: Checkpoint) -> list[Finding]:
    findings: list[Finding] = []
    for sd in ckpt.state_dicts:
        keys = list(sd.tensors)
        leading = leading_wrapper_prefix(keys)
        infix = keys_with_infix_compile_wrapper(keys)
        partial = partial_wrapper_keys(keys)
        if leading:
            message = (f"every key of the {_where(sd)} starts with '{leading}' "
                       f"({' + '.join(wrappers_named(leading))} wrapper saved instead of the model); "
                       f"load_state_dict on the unwrapped model fails with 'Unexpected key(s)' "
                       f"such as {keys[0]!r}")
            evidence = {"prefix": leading, "keys": len(keys), "example": keys[0]}
        elif infix:
            message = (f"{len(infix)} key(s) of the {_where(sd)} contain '._orig_mod.' "
                       f"(a torch.compile'd submodule was saved), e.g. {infix[0]!r}")
            evidence = {"infix": "._orig_mod.", "keys": len(infix), "example": infix[0]}
        elif partial:
            message = (f"{len(partial)} of {len(keys)} keys of the {_where(sd)} start with a wrapper "
                       f"prefix, the others do not (a state dict merged from wrapped and unwrapped "
                       f"models), e.g. {partial[0]!r}")
            evidence = {"keys": len(partial), "of": len(keys), "example": partial[0]}
        else:
            continue
        findings.append(shared_finding(
            "C101", message, path=ckpt.path, evidence=evidence,
            fix=(f"nndoctor ckpt fix {ckpt.path} -o OUT strips it; in training code save "
                 f"model.module.state_dict() (DataParallel/DDP) or model._orig_mod.state_dict() "
                 f"(torch.compile)"),
        ))
    return findings


def nonfinite_findings(ckpt: Checkpoint) -> list[Finding]:
    import numpy as np

    # A value can only be a torch.Tensor once torch is imported: safetensors and Keras files
    # read without torch hold numpy arrays, and inspecting them must not need torch.
    torch = sys.modules.get("torch")
    bad: dict[str, int] = {}
    for sd in ckpt.state_dicts:
        for key, value in sd.tensors.items():
            if torch is not None and isinstance(value, torch.Tensor):
                # Only dense tensors with data: sparse/meta ones (--trust) have no values to count.
                if value.layout == torch.strided and not value.is_meta and value.is_floating_point() and value.numel():
                    count = int((~torch.isfinite(value)).sum())
                else:
                    continue
            elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
                count = int((~np.isfinite(value)).sum())
            else:
                continue
            if count:
                bad[(sd.where + "/" if sd.where else "") + key] = count
    if not bad:
        return []
    keys = list(bad)
    return [checks.NonfiniteWeights.finding(
        f"{len(bad)} tensor(s) hold NaN/Inf values ({sum(bad.values())} values in all): {_some(keys)}",
        location=Location(ckpt.path), evidence={"nonfinite_values": bad})]


def inspect_findings(ckpt: Checkpoint) -> list[Finding]:
    return safety_findings(ckpt) + prefix_findings(ckpt) + nonfinite_findings(ckpt)


def _pairs(entries: list) -> list[str]:
    return [f"{s} {si.shape_text()} vs {d} {di.shape_text()}" for s, d, si, di in entries]


_TF_KEY_FIX = ("restore into a model built like the one that wrote the checkpoint (variables are matched "
               "by their object path), or restore the matching part only and train the rest")


def mapping_findings(mapping: KeyMapping, *, source: str, target: str, fix_command: str,
                     tensorflow: bool = False) -> list[Finding]:
    """Findings of ``diff``: C201 keys, C202 shapes, C203 head, C204 dtypes, C210 counters.

    ``tensorflow``: both sides are TensorFlow checkpoints, whose keys are object paths joined
    by "/" and which are restored with ``tf.train.Checkpoint``, not ``load_state_dict``."""
    findings: list[Finding] = []
    location = Location(source)
    counters_only = bool(mapping.missing) and all(k.endswith("num_batches_tracked") for k in mapping.missing)
    renamed = {s: t for s, t in mapping.source_to_target.items() if s != t}
    if mapping.rules or mapping.unexpected or (mapping.missing and not counters_only):
        parts = []
        if renamed:
            parts.append(f"{len(renamed)} key(s) need renaming: "
                         + "; ".join(f"{r.describe()} ({r.count} keys)" for r in mapping.rules))
        if mapping.unexpected:
            parts.append(f"{len(mapping.unexpected)} unexpected (only in {source}): {_some(mapping.unexpected)}")
        missing = [k for k in mapping.missing if not (counters_only and k.endswith("num_batches_tracked"))]
        if missing:
            parts.append(f"{len(missing)} missing (only in {target}): {_some(missing)}")
        consequence = (f"; restoring one into the other's model leaves {len(mapping.unexpected) + len(mapping.missing)} "
                       f"variable(s) unmatched (assert_consumed() fails)" if tensorflow else
                       f"; load_state_dict(strict=True) fails and strict=False would skip "
                       f"{len(renamed) + len(mapping.unexpected)} tensor(s)")
        findings.append(checks.StateDictKeyMismatch.finding(
            "; ".join(parts) + consequence,
            location=location,
            evidence={"rules": [r.describe() for r in mapping.rules], "renamed": len(renamed),
                      "unexpected": mapping.unexpected, "missing": mapping.missing,
                      "matched": mapping.matched},
            fix=_TF_KEY_FIX if tensorflow else fix_command if mapping.rules else checks.StateDictKeyMismatch.fix,
        ))
    if counters_only:
        findings.append(checks.MissingBatchNormCounter.finding(
            f"only {len(mapping.missing)} BatchNorm num_batches_tracked buffer(s) are missing "
            f"({_some(mapping.missing)}): the checkpoint predates PyTorch 0.4.1",
            location=location, evidence={"missing": mapping.missing}))
    if mapping.shape_mismatches:
        findings.append(checks.StateDictShapeMismatch.finding(
            f"{len(mapping.shape_mismatches)} tensor(s) differ in shape: {_some(_pairs(mapping.shape_mismatches))}",
            location=location, evidence={"mismatches": _pairs(mapping.shape_mismatches)}))
    if mapping.head_changes:
        counts = class_counts(mapping.head_changes)
        head_keys = [d for _s, d, _si, _di in mapping.head_changes]
        module = head_keys[0].rpartition("/" if tensorflow else ".")[0]
        head_fix = (f"restore everything but '{module}' (a tf.train.Checkpoint over the other layers), then "
                    f"train the new head" if tensorflow else
                    f"drop the head and load the rest: nndoctor ckpt fix {source} -o OUT "
                    f"--drop '^{module.replace('.', chr(92) + '.')}\\.' (then strict=False, expecting only "
                    f"{', '.join(head_keys)} missing)")
        findings.append(checks.ClassifierHeadChanged.finding(
            f"the output layer '{module}' has {counts[0] if counts else '?'} outputs in {source} "
            f"and {counts[1] if counts else '?'} in {target}: {_some(_pairs(mapping.head_changes))}",
            location=location,
            evidence={"module": module, "classes": list(counts) if counts else None, "keys": head_keys},
            fix=head_fix))
    if mapping.dtype_mismatches:
        findings.append(checks.StateDictDtypeMismatch.finding(
            f"{len(mapping.dtype_mismatches)} tensor(s) change dtype on load: "
            + _some([f"{s} {si.dtype} → {di.dtype}" for s, _d, si, di in mapping.dtype_mismatches]),
            location=location,
            evidence={"dtypes": {s: [si.dtype, di.dtype] for s, _d, si, di in mapping.dtype_mismatches}}))
    return findings
