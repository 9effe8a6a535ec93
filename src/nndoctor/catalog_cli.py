"""``nndoctor checks [CODE]``: the catalog, or one check's full documentation."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table

from nndoctor.errors import UsageError
from nndoctor.registry import all_checks, get_check


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("code", nargs="?", help="a check code (M101) or name (eval-in-train-mode)")
    parser.add_argument("--scope", choices=["run", "explain", "data", "ckpt", "perf"],
                        help="only checks of this subcommand")
    parser.add_argument("--markdown", action="store_true", help="print raw Markdown")


def run(args: argparse.Namespace) -> int:
    console = Console(file=sys.stdout, highlight=False)
    if args.code:
        cls = get_check(args.code)
        if cls is None:
            raise UsageError(f"no check named {args.code!r} (see 'nndoctor checks')")
        header = f"# {cls.code} {cls.name} ({cls.severity.label}, nndoctor {cls.scope})\n\n{cls.summary}\n\n"
        text = header + cls.documentation() + f"\n\n## Fix\n{cls.fix}\n"
        if args.markdown or not sys.stdout.isatty():
            sys.stdout.write(text)
        else:
            console.print(Markdown(text))
        return 0
    table = Table(title="nndoctor checks", show_lines=False)
    for column in ("code", "name", "severity", "command", "what it detects"):
        table.add_column(column)
    for cls in all_checks(args.scope):
        table.add_row(cls.code, cls.name, cls.severity.label, cls.scope, cls.summary)
    if args.markdown:
        for cls in all_checks(args.scope):
            sys.stdout.write(f"| {cls.code} | {cls.name} | {cls.severity.label} | {cls.scope} | {cls.summary} |\n")
    else:
        console.print(table)
    return 0
