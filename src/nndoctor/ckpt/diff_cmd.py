"""Compare checkpoint A with checkpoint B or with a model built by --model MODULE:CALLABLE:
missing, unexpected and shape-mismatched keys, and the mapping that makes A fit (prefix
strip/add, renames matched by structure and shapes, a resized classification head)."""

from __future__ import annotations

import argparse
import shlex
import sys

from nndoctor.ckpt.analysis import mapping_findings, safety_findings
from nndoctor.ckpt.checkpoint import Checkpoint, StateDict, TensorInfo
from nndoctor.ckpt.mapping import propose_mapping
from nndoctor.ckpt.reader import read_checkpoint
from nndoctor.ckpt.render import print_diff
from nndoctor.errors import UsageError
from nndoctor.findings import Report


def configure(parser: argparse.ArgumentParser) -> None:
    from nndoctor.ckpt.cli import add_key_option, add_trust_option

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
        from nndoctor.ckpt.model_spec import build_torch_model

        model = build_torch_model(args.model)
        return {k: TensorInfo.of(v) for k, v in model.state_dict().items()}, args.model, model
    if not args.b:
        raise UsageError("diff needs a second checkpoint or --model MODULE:CALLABLE")
    other = other if other is not None else read_checkpoint(args.b, trust=args.trust)
    return select_state_dict(other, None).infos(), args.b, None


def run(args: argparse.Namespace) -> int:
    from nndoctor.ckpt.cli import finish, unreadable_but_unsafe

    ckpt = read_checkpoint(args.a, trust=args.trust)
    other = read_checkpoint(args.b, trust=args.trust) if args.b and not args.model else None
    read = [c for c in (ckpt, other) if c is not None]
    if any(c.unsafe_globals and not c.state_dicts for c in read):
        return unreadable_but_unsafe(read, ["ckpt", "diff", args.a] + ([args.b] if args.b else []), args)
    source = select_state_dict(ckpt, args.key)
    target, label, _model = target_infos(args, other)
    mapping = propose_mapping(source.infos(), target)
    if getattr(args, "json", None) != "-":
        print_diff(mapping, args.a, label, sys.stdout)
    fix_command = (f"nndoctor ckpt fix {shlex.quote(args.a)} -o FIXED.safetensors "
                   + (f"--model {shlex.quote(args.model)}" if args.model else
                      " ".join(r.as_option() for r in mapping.rules)))
    report = Report(command=["ckpt", "diff", args.a, label])
    safety = [f for c in read for f in safety_findings(c)]
    for finding in safety + mapping_findings(mapping, source=args.a, target=label, fix_command=fix_command):
        report.add(finding)
    report.extra["diff"] = {
        "source": args.a, "target": label, "exact": mapping.exact, "matched": mapping.matched,
        "rules": [{"kind": r.kind, "old": r.old, "new": r.new, "keys": r.count} for r in mapping.rules],
        "mapping": {s: t for s, t in mapping.source_to_target.items() if s != t},
        "unexpected": mapping.unexpected, "missing": mapping.missing,
        "shape_mismatches": [[s, d, list(si.shape), list(di.shape)] for s, d, si, di in mapping.shape_mismatches],
        "head_changes": [[s, d, list(si.shape), list(di.shape)] for s, d, si, di in mapping.head_changes],
        "loads_strictly_after_mapping": mapping.loads_strictly,
    }
    return finish(report, args)
