"""Show a checkpoint's tensors as a tree (shapes, dtypes, parameter counts), its other
entries (epoch, optimizer …) and its problems: wrapper prefixes (C101), pickled models
(C103), globals outside the weights_only allowlist (C104), NaN/Inf weights (C209).
Nothing in the file is executed unless --trust is given."""

from __future__ import annotations

import argparse
import sys

from nndoctor.commands.ckpt.analysis import inspect_findings
from nndoctor.commands.ckpt.reader import read_checkpoint
from nndoctor.commands.ckpt.render import print_inspect
from nndoctor.core.findings import Report
from nndoctor.util.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    from nndoctor.commands.ckpt.cli import add_trust_option

    parser.add_argument("file", help=".pt/.pth/.bin, Lightning .ckpt, .safetensors, .h5/.keras/.weights.h5, a "
                                     "TensorFlow checkpoint (prefix, .index or folder) or SavedModel folder; "
                                     "s3:// and other fsspec URLs")
    parser.add_argument("--depth", type=int, default=None,
                        help="levels of the key tree to show (default: all, or 3 for big models)")
    add_trust_option(parser)


def build_report(args: argparse.Namespace) -> Report:
    from nndoctor.commands.ckpt.hf_folder import describe, is_trainer_folder

    text_report = not getattr(args, "quiet", False) and getattr(args, "output_format", "text") == "text"
    text_report = text_report and getattr(args, "json", None) != "-"
    trainer_folder = describe(args.file) if is_trainer_folder(args.file) else None
    if trainer_folder is not None:  # a 🤗 Trainer checkpoint-N/ folder: its weights + bookkeeping
        if trainer_folder.weights is None:
            raise UsageError(f"{args.file}: a Trainer checkpoint folder without a weights file")
        ckpt = read_checkpoint(trainer_folder.weights, trust=args.trust)
    else:
        ckpt = read_checkpoint(args.file, trust=args.trust)
    if text_report:
        print_inspect(ckpt, sys.stdout, max_depth=args.depth)
        if trainer_folder is not None:
            print(f"Trainer checkpoint folder {args.file}:")
            for line in trainer_folder.lines:
                print(f"  {line}")
            print()
    report = Report(command=["ckpt", "inspect", args.file])
    for finding in inspect_findings(ckpt):
        report.add(finding)
    report.extra["checkpoint"] = {
        "path": ckpt.path,
        "format": ckpt.format,
        "read_mode": ckpt.read_mode,
        "globals": ckpt.globals,
        "unsafe_globals": ckpt.unsafe_globals,
        "state_dicts": [
            {"where": sd.where, "role": sd.role, "tensors": len(sd.tensors),
             "parameters": sd.parameter_count,
             "keys": {k: {"shape": list(i.shape), "dtype": i.dtype} for k, i in sd.infos().items()}}
            for sd in ckpt.state_dicts
        ],
        "other_entries": ckpt.other_entries,
        "metadata": ckpt.metadata,
    }
    if trainer_folder is not None:
        report.extra["checkpoint"]["trainer_folder"] = trainer_folder.lines
    return report


def run(args: argparse.Namespace) -> int:
    from nndoctor.commands.ckpt.cli import finish

    return finish(build_report(args), args)
