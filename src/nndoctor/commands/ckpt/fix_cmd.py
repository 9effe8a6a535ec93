"""Write a repaired copy of a checkpoint; the input is never modified.

With no option, wrapper prefixes (module., _orig_mod.) are stripped when every key carries
one, and a pickled nn.Module becomes a plain state dict (extracted without running the
pickle). --strip-prefix/--rename/--add-prefix/--drop apply in that order. With --model the
mapping proposed by diff is applied and the result must load strictly into the model
before anything is written. The output format follows the suffix (.safetensors or .pt)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping
from typing import Any

from rich.console import Console

from nndoctor.commands.ckpt.analysis import mapping_findings, prefix_findings, safety_findings
from nndoctor.commands.ckpt.checkpoint import Checkpoint, StateDict, TensorInfo
from nndoctor.commands.ckpt.diff_cmd import select_state_dict
from nndoctor.commands.ckpt.mapping import parse_rename, propose_mapping
from nndoctor.commands.ckpt.prefixes import (
    keys_with_infix_compile_wrapper,
    leading_wrapper_prefix,
    strip_wrappers,
)
from nndoctor.commands.ckpt.reader import read_checkpoint
from nndoctor.commands.ckpt.render import escape
from nndoctor.commands.ckpt.writer import check_output_path, replace_at, write_state_dict
from nndoctor.core.findings import Report
from nndoctor.util.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    from nndoctor.commands.ckpt.cli import add_key_option, add_trust_option

    parser.add_argument("input", help="the checkpoint to repair (never modified)")
    parser.add_argument("-o", "--output", required=True, help="where to write (.safetensors or .pt)")
    parser.add_argument("--strip-prefix", metavar="P", action="append", default=[],
                        help="remove P from the start of every key that has it")
    parser.add_argument("--add-prefix", metavar="P", help="put P in front of every key")
    parser.add_argument("--rename", metavar="REGEX=REPL", action="append", default=[],
                        help="re.sub(REGEX, REPL, key) on every key (repeatable)")
    parser.add_argument("--drop", metavar="REGEX", action="append", default=[],
                        help="remove keys matching REGEX (re.search; repeatable)")
    parser.add_argument("--model", metavar="MODULE:CALLABLE",
                        help="apply the mapping diff proposes for this model and verify a strict load")
    add_key_option(parser)
    add_trust_option(parser)


def _explicit_edits(tensors: dict[str, Any], args: argparse.Namespace, log: list[str]) -> dict[str, Any]:
    try:
        renames = [parse_rename(text) for text in args.rename]
        drops = [re.compile(text) for text in args.drop]
    except (ValueError, re.error) as error:
        raise UsageError(str(error)) from None
    result: dict[str, Any] = {}
    dropped = 0
    for key, value in tensors.items():
        new = key
        for prefix in args.strip_prefix:
            if new.startswith(prefix):
                new = new[len(prefix):]
        for pattern, replacement in renames:
            new = pattern.sub(replacement, new)
        if args.add_prefix:
            new = args.add_prefix + new
        if any(p.search(new) or p.search(key) for p in drops):
            dropped += 1
            continue
        if new in result:
            raise UsageError(f"two keys become {new!r} after renaming; refine --rename/--strip-prefix")
        result[new] = value
    renamed = sum(1 for old, new in zip(tensors, result) if old != new)
    if args.strip_prefix or args.rename or args.add_prefix:
        log.append(f"renamed {renamed} key(s) with the given options")
    if drops:
        log.append(f"dropped {dropped} key(s) matching {', '.join(args.drop)}")
    return result


def _default_edits(tensors: dict[str, Any], log: list[str]) -> dict[str, Any]:
    leading = leading_wrapper_prefix(tensors)
    infix = keys_with_infix_compile_wrapper(tensors)
    if not leading and not infix:
        return tensors
    if leading:
        log.append(f"stripped wrapper prefix '{leading}' from {len(tensors)} key(s)")
    if infix:
        log.append(f"removed '._orig_mod.' from {len(infix)} key(s)")
    return {strip_wrappers(k, leading): v for k, v in tensors.items()}


def _fit_to_model(tensors: dict[str, Any], model: Any, log: list[str], dropped_on_purpose: list[re.Pattern[str]],
                  source: str, label: str, report: Report) -> dict[str, Any] | None:
    """Apply diff's mapping, add missing BatchNorm counters, and verify the load."""
    import torch

    model_sd = model.state_dict()
    mapping = propose_mapping({k: TensorInfo.of(v) for k, v in tensors.items()},
                              {k: TensorInfo.of(v) for k, v in model_sd.items()})
    result = {mapping.source_to_target[k]: v for k, v in tensors.items()
              if k in mapping.source_to_target}
    for rule in mapping.rules:
        log.append(f"{rule.describe()} ({rule.count} keys)")
    counters = [k for k in mapping.missing if k.endswith("num_batches_tracked")]
    for key in counters:
        result[key] = torch.zeros((), dtype=torch.long)
    if counters:
        log.append(f"added {len(counters)} num_batches_tracked counter(s) (old checkpoint)")
    missing = [k for k in mapping.missing if k not in counters]
    allowed_missing = [k for k in missing if any(p.search(k) for p in dropped_on_purpose)]
    blocking = (mapping.unexpected or mapping.shape_mismatches or mapping.head_changes
                or len(allowed_missing) != len(missing))
    if blocking:
        for finding in mapping_findings(mapping, source=source, target=label,
                                        fix_command="add --drop REGEX for keys you mean to leave out"):
            report.add(finding)
        return None
    try:
        incompatible = model.load_state_dict(result, strict=not allowed_missing)
    except RuntimeError as error:
        raise UsageError(f"the repaired state dict does not load into the model: {error}") from None
    if allowed_missing:
        log.append(f"verified: loads into {label} with strict=False, missing only the dropped "
                   f"{', '.join(incompatible.missing_keys)}")
    else:
        log.append(f"verified: load_state_dict(strict=True) into {label} succeeds")
    return result


def _container(ckpt: Checkpoint, sd: StateDict, new: dict[str, Any], out: str) -> Any:
    """Keep the rest of a {"model": …, "optimizer": …} checkpoint when writing .pt."""
    if out.endswith(".safetensors") or sd.role != "weights" or ckpt.read_mode not in ("weights_only", "trusted"):
        return None
    if not isinstance(ckpt.root, Mapping) or not sd.where:
        return None
    try:
        return replace_at(ckpt.root, sd.where, new)
    except KeyError:
        return None


def run(args: argparse.Namespace) -> int:
    from nndoctor.commands.ckpt.cli import finish

    check_output_path(args.output, [args.input])
    from nndoctor.commands.ckpt.cli import unreadable_but_unsafe

    ckpt = read_checkpoint(args.input, trust=args.trust)
    if ckpt.unsafe_globals and not ckpt.state_dicts:
        return unreadable_but_unsafe(ckpt, ["ckpt", "fix", args.input, "-o", args.output], args)
    sd = select_state_dict(ckpt, args.key)
    if ckpt.format in ("npz", "npy"):
        raise UsageError(f"{args.input}: a numpy file; load it with numpy.load(allow_pickle=False) "
                         f"and save the arrays with safetensors")
    if sd.role == "weights" and ckpt.format.startswith("keras"):
        raise UsageError("this is a Keras file: use 'nndoctor ckpt convert' to turn it into a PyTorch state_dict")
    log: list[str] = []
    if sd.role == "whole-model":
        log.append(f"extracted the state dict of the pickled nn.Module ({len(sd.tensors)} tensors) "
                   f"without executing the pickle" if ckpt.read_mode != "trusted" else
                   f"extracted the state dict of the pickled nn.Module ({len(sd.tensors)} tensors)")
    explicit = bool(args.strip_prefix or args.rename or args.add_prefix or args.drop)
    tensors = dict(sd.tensors)
    tensors = _explicit_edits(tensors, args, log) if explicit else tensors
    if not explicit and not args.model:
        tensors = _default_edits(tensors, log)
    report = Report(command=["ckpt", "fix", args.input, "-o", args.output])
    for finding in safety_findings(ckpt):
        report.add(finding)
    to_write: dict[str, Any] | None = tensors  # None: nothing is written
    if args.model:
        from nndoctor.commands.ckpt.model_spec import build_torch_model

        model = build_torch_model(args.model)
        drops = [re.compile(d) for d in args.drop]
        to_write = _fit_to_model(tensors, model, log, drops, args.input, args.model, report)
        if to_write is None:
            log.append(f"NOT written: the result would not load into {args.model} (see findings)")
    if to_write is not None:
        tensors = to_write
        if not log:
            log.append("no wrapper prefix or pickled model found; wrote the state dict unchanged")
        write_state_dict(args.output, tensors, container=_container(ckpt, sd, tensors, args.output),
                         metadata={"source": args.input, "written_by": "nndoctor ckpt fix"})
        log.append(f"wrote {len(tensors)} tensors to {args.output}")
        for finding in prefix_findings(Checkpoint(args.output, "output", state_dicts=[StateDict("", tensors)])):
            report.add(finding)
    if getattr(args, "json", None) != "-":
        from nndoctor.report.terminal import no_color_options

        console = Console(file=sys.stdout, highlight=False, **no_color_options())
        console.print(f"[bold]fix[/bold] {escape(args.input)} → {escape(args.output)}")
        for line in log:
            console.print(f"  {escape(line)}")
        console.print()
    report.extra["fix"] = {"input": args.input, "output": args.output, "actions": log,
                           "written": to_write is not None}
    code = finish(report, args)
    return code if to_write is not None else max(code, 1)
