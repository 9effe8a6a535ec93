"""``nndoctor ckpt``: inspect, diff, fix and convert checkpoints (sub-subcommands)."""

from __future__ import annotations

import argparse
from typing import Any

from nndoctor.core.findings import Report
from nndoctor.core.selection import fail_threshold, filter_findings, selectors
from nndoctor.report.delivery import ReportDelivery

_ACTIONS = {
    "inspect": ("nndoctor.commands.ckpt.inspect_cmd", "show what a checkpoint holds, safely"),
    "diff": ("nndoctor.commands.ckpt.diff_cmd", "compare a checkpoint's keys with another checkpoint or a model"),
    "fix": ("nndoctor.commands.ckpt.fix_cmd", "strip wrapper prefixes, rename or drop keys; write a new file"),
    "convert": ("nndoctor.commands.ckpt.convert_cmd", "convert Keras weights to a PyTorch state_dict, verified"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    import importlib

    from nndoctor.cli import add_common_options

    sub = parser.add_subparsers(dest="ckpt_action", metavar="ACTION")
    for name, (module_name, help_text) in _ACTIONS.items():
        module = importlib.import_module(module_name)
        action_parser = sub.add_parser(name, help=help_text, description=module.__doc__)
        module.configure(action_parser)
        add_common_options(action_parser)
        action_parser.set_defaults(_ckpt_run=module.run)
    parser.set_defaults(_ckpt_parser=parser)


def run(args: argparse.Namespace) -> int:
    handler = getattr(args, "_ckpt_run", None)
    if handler is None:
        args._ckpt_parser.print_help()
        return 2
    json_path = getattr(args, "json", None)
    if json_path and json_path != "-":
        from nndoctor.commands.ckpt.writer import check_writable_file

        check_writable_file(json_path, "--json")
    return int(handler(args) or 0)


def finish(report: Report, args: argparse.Namespace) -> int:
    """Filter by --select/--ignore, print, write --json, and turn --fail-on into an exit status."""
    select, ignore = selectors(args)
    filter_findings(report, select, ignore)
    output = ReportDelivery.from_args(args, text_stream="stdout")  # a bad --json path: exit 2
    try:
        output.deliver(report)
    finally:
        output.close()
    return 1 if report.reaches(fail_threshold(args)) else 0


def unreadable_but_unsafe(ckpts: Any, command: list[str], args: argparse.Namespace) -> int:
    """Exit through the C104 report when a file names unsafe globals but holds nothing usable.

    diff/fix/convert cannot do their job on such a file; what matters is that it is dangerous.
    """
    from nndoctor.commands.ckpt.analysis import safety_findings

    ckpts = ckpts if isinstance(ckpts, list) else [ckpts]
    report = Report(command=command)
    for ckpt in ckpts:
        for finding in safety_findings(ckpt):
            report.add(finding)
    report.extra["checkpoints"] = [{"path": c.path, "format": c.format, "read_mode": c.read_mode,
                                    "unsafe_globals": c.unsafe_globals} for c in ckpts]
    return max(finish(report, args), 1)


def add_trust_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust", action="store_true",
                        help="allow the pickle to import and call what it references "
                             "(weights_only=False) — only for files you created yourself")


def add_key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--key", metavar="WHERE",
                        help="which state dict of a container to use (e.g. state_dict, model, ema); "
                             "default: the model's")
