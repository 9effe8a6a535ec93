"""Compare checkpoint A with checkpoint B or with a model built by --model MODULE:CALLABLE:
missing, unexpected and shape-mismatched keys, and the mapping that makes A fit (prefix
strip/add, renames matched by structure and shapes, a resized classification head); between
two checkpoints, also which matched tensors changed value."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from nndoctor.commands.ckpt.analysis import mapping_findings, safety_findings
from nndoctor.commands.ckpt.checkpoint import Checkpoint, StateDict, TensorInfo
from nndoctor.commands.ckpt.mapping import propose_mapping
from nndoctor.commands.ckpt.reader import read_checkpoint
from nndoctor.commands.ckpt.render import print_diff
from nndoctor.core.findings import Report
from nndoctor.util.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    from nndoctor.commands.ckpt.cli import add_key_option, add_trust_option

    parser.add_argument("a", help="the checkpoint to fit")
    parser.add_argument("b", nargs="?", help="a second checkpoint (or use --model)")
    parser.add_argument("--model", metavar="MODULE:CALLABLE", help="build the target model (e.g. models.py:build)")
    add_key_option(parser)
    add_trust_option(parser)


def select_state_dict(ckpt: Checkpoint, key: str | None) -> StateDict:
    if key is not None:
        sd = ckpt.find(key)
        if sd is None:
            found = ", ".join(repr(s.where) for s in ckpt.state_dicts) or "none"
            raise UsageError(f"{ckpt.path}: no state dict at {key!r} (found: {found})")
        return sd
    sd = ckpt.primary
    if sd is None:
        raise UsageError(f"{ckpt.path}: no tensors found in this checkpoint")
    return sd


def target_infos(args: argparse.Namespace, other: Checkpoint | None = None,
                 ) -> tuple[dict[str, TensorInfo], str, object]:
    """(infos, label, model or None) of the diff target (``other``: checkpoint B, already read)."""
    if args.model and args.b:
        raise UsageError("give either a second checkpoint or --model, not both")
    if args.model:
        from nndoctor.commands.ckpt.model_spec import build_torch_model

        model = build_torch_model(args.model)
        return {k: TensorInfo.of(v) for k, v in model.state_dict().items()}, args.model, model
    if not args.b:
        raise UsageError("diff needs a second checkpoint or --model MODULE:CALLABLE")
    other = other if other is not None else read_checkpoint(args.b, trust=args.trust)
    return select_state_dict(other, None).infos(), args.b, None


def _as_numbers(value: Any) -> Any:
    import numpy as np

    if hasattr(value, "detach"):  # a torch tensor (bfloat16 has no numpy dtype)
        value = value.detach().cpu()
        return (value.double() if value.is_floating_point() else value).numpy()
    return np.asarray(value)


def changed_values(source: StateDict, target: StateDict, pairs: dict[str, str]) -> dict[str, float]:
    """Matched tensors of the same shape whose values differ: key -> largest absolute difference."""
    import numpy as np

    changed: dict[str, float] = {}
    for key, other_key in pairs.items():
        a, b = source.tensors.get(key), target.tensors.get(other_key)
        if a is None or b is None:
            continue
        try:
            left, right = _as_numbers(a), _as_numbers(b)
            if left.shape != right.shape or left.dtype.kind not in "fiub" or right.dtype.kind not in "fiub":
                continue
            if not np.array_equal(left, right, equal_nan=left.dtype.kind == "f"):
                changed[key] = float(np.nanmax(np.abs(left.astype(np.float64) - right.astype(np.float64))))
        except (TypeError, ValueError, RuntimeError):  # placeholders, meta or sparse tensors: not compared
            continue
    return changed


def _print_changed(changed: dict[str, float], matched: int) -> None:
    from nndoctor.commands.ckpt.render import escape

    if not changed:
        print(f"values: all {matched} matched tensors are identical\n")
        return
    print(f"values: {len(changed)} of {matched} matched tensors differ")
    for key, diff in sorted(changed.items(), key=lambda item: -item[1])[:10]:
        print(f"  {escape(key)}: max |a - b| = {diff:.3g}")
    if len(changed) > 10:
        print(f"  … {len(changed) - 10} more (all in --json)")
    print()


def run(args: argparse.Namespace) -> int:
    from nndoctor.commands.ckpt.cli import finish, unreadable_but_unsafe

    ckpt = read_checkpoint(args.a, trust=args.trust)
    other = read_checkpoint(args.b, trust=args.trust) if args.b and not args.model else None
    read = [c for c in (ckpt, other) if c is not None]
    if any(c.unsafe_globals and not c.state_dicts for c in read):
        return unreadable_but_unsafe(read, ["ckpt", "diff", args.a] + ([args.b] if args.b else []), args)
    source = select_state_dict(ckpt, args.key)
    target, label, _model = target_infos(args, other)
    mapping = propose_mapping(source.infos(), target)
    changed: dict[str, float] | None = None
    if other is not None:
        changed = changed_values(source, select_state_dict(other, None), mapping.source_to_target)
    tensorflow = ckpt.format.startswith("tf-") and other is not None and other.format.startswith("tf-")
    if getattr(args, "json", None) != "-":
        print_diff(mapping, args.a, label, sys.stdout, tensorflow=tensorflow)
        if changed is not None:
            _print_changed(changed, len(mapping.source_to_target))
    fix_command = (f"nndoctor ckpt fix {shlex.quote(args.a)} -o FIXED.safetensors "
                   + (f"--model {shlex.quote(args.model)}" if args.model else
                      " ".join(r.as_option() for r in mapping.rules)))
    report = Report(command=["ckpt", "diff", args.a, label])
    safety = [f for c in read for f in safety_findings(c)]
    for finding in safety + mapping_findings(mapping, source=args.a, target=label, fix_command=fix_command,
                                             tensorflow=tensorflow):
        report.add(finding)
    report.extra["diff"] = {
        "source": args.a, "target": label, "exact": mapping.exact, "matched": mapping.matched,
        "rules": [{"kind": r.kind, "old": r.old, "new": r.new, "keys": r.count} for r in mapping.rules],
        "mapping": {s: t for s, t in mapping.source_to_target.items() if s != t},
        "unexpected": mapping.unexpected, "missing": mapping.missing,
        "shape_mismatches": [[s, d, list(si.shape), list(di.shape)] for s, d, si, di in mapping.shape_mismatches],
        "head_changes": [[s, d, list(si.shape), list(di.shape)] for s, d, si, di in mapping.head_changes],
        "loads_strictly_after_mapping": mapping.loads_strictly,
        "changed_values": changed,
    }
    return finish(report, args)
