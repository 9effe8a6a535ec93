"""The ``nndoctor`` command line: shared options, subcommand dispatch, exit statuses.

Each subcommand lives in its own module exposing ``configure(parser)`` and
``run(args) -> int``; this file only wires them together, so ``nndoctor data`` is found in
``nndoctor/commands/data/cli.py`` and so on.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from nndoctor.core._version import __version__
from nndoctor.util.errors import UsageError

# name -> (module, one-line help). Order is the order of ``nndoctor --help``.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("nndoctor.run.cli", "run a training script under the doctor"),
    "fix": ("nndoctor.commands.fix.cli", "run a training script under the doctor, then edit its source to fix the findings"),
    "demo": ("nndoctor.commands.demo.cli", "run the bundled, deliberately buggy training demo"),
    "checks": ("nndoctor.catalog.cli", "list the catalog, or show one check's documentation"),
    "explain": ("nndoctor.commands.explain.cli", "explain a saved traceback or log"),
    "data": ("nndoctor.commands.data.cli", "check an image dataset (folders, TFRecord, HDF5, LMDB, WebDataset, Parquet, NumPy) before training"),
    "ckpt": ("nndoctor.commands.ckpt.cli", "inspect, diff, repair and convert checkpoints"),
    "perf": ("nndoctor.commands.perf.cli", "where the step time goes and what to change"),
    "preflight": ("nndoctor.commands.preflight.cli", "run active tests on copies of the model at the first step, then stop"),
    "env": ("nndoctor.commands.env.cli", "check the installation: frameworks, CUDA builds, driver, GPUs, packages"),
}

FAIL_ON_CHOICES = ("error", "warning", "info", "never")


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Options every subcommand shares: --json, --select, --ignore, --fail-on."""
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH ('-' for stdout)")
    parser.add_argument("--select", metavar="CODES", action="append", default=[],
                        help="only these checks (codes, prefixes like O1, or names; comma-separated)")
    parser.add_argument("--ignore", metavar="CODES", action="append", default=[],
                        help="skip these checks (codes, prefixes or names; comma-separated)")
    parser.add_argument("--fail-on", choices=FAIL_ON_CHOICES, default="error",
                        help="exit 1 when a finding reaches this severity (default: error)")
    add_output_options(parser)


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """Configuration, output formats and report files (README: Configuration, CI)."""
    from nndoctor.core.config import OUTPUT_FORMATS

    parser.add_argument("--quiet", action="store_true", help="print no report on the terminal")
    parser.add_argument("--output-format", choices=OUTPUT_FORMATS, default="text",
                        help="terminal report: text (default), concise (one line per finding), "
                             "github (GitHub Actions annotations, on stdout), json (on stdout)")
    parser.add_argument("--sarif", metavar="PATH", help="also write a SARIF 2.1.0 report (code scanning)")
    parser.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report with plots")
    parser.add_argument("--tensorboard", metavar="DIR",
                        help="also write the doctor's scalars and findings as a TensorBoard event file")
    parser.add_argument("--report-unused-ignores", action="store_true",
                        help="list '# nndoctor: ignore' comments that silenced nothing")
    parser.add_argument("--config", metavar="PATH",
                        help="read options from this file instead of the nearest pyproject.toml")
    parser.add_argument("--isolated", action="store_true", help="ignore every configuration file")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, import just that subcommand's module (a broken or slow
    module of another subcommand must not break this one, and ``nndoctor data`` should not
    pay for importing torch)."""
    parser = argparse.ArgumentParser(
        prog="nndoctor",
        description="Finds the bugs that silently ruin deep-learning training, and explains the crashes that stop it.",
    )
    parser.add_argument("--version", action="version", version=f"nndoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # noqa: BLE001 - report it when this subcommand is used
            sub_parser.set_defaults(_broken=f"{name} is unavailable: {type(error).__name__}: {error}")
            continue
        module.configure(sub_parser)
        sub_parser.set_defaults(_handler=module.run)
    return parser


# Subcommands that run a user's script: everything from the script (or ``-m MODULE``) on
# belongs to the script, even options like ``--lr``.
SCRIPT_RUNNERS = ("run", "fix", "perf", "preflight")


def _split_script_argv(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Insert ``--`` where the script's own arguments start, so argparse leaves them alone."""
    if not argv or argv[0] not in SCRIPT_RUNNERS:
        return argv
    sub_action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = sub_action.choices.get(argv[0])
    if sub is None:
        return argv
    takes_value = {
        option for action in sub._actions for option in action.option_strings if action.nargs != 0
    }
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv
        if token == "-m":
            if i + 1 >= len(argv):
                return argv
            return argv[: i + 2] + ["--"] + argv[i + 2:]
        if not token.startswith("-") or token == "-":
            return argv[:i] + ["--"] + argv[i:]
        i += 2 if (token in takes_value and "=" not in token) else 1
    return argv


def _usage_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost parser of the command given, so an unknown option shows its usage."""
    sub_action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = sub_action.choices.get(getattr(args, "command", None) or "")
    if sub is None:
        return parser
    nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
    action = getattr(args, "ckpt_action", None)
    if nested and action in nested[0].choices:
        return nested[0].choices[action]
    return sub


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    parser = build_parser(only)
    args, unknown = parser.parse_known_args(_split_script_argv(parser, argv))
    if unknown:
        _usage_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    broken = getattr(args, "_broken", None)
    if broken:
        print(f"nndoctor: error: {broken}", file=sys.stderr)
        return 2
    handler = getattr(args, "_handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        # Subcommands with the shared options read the project's config; the bundled demo is
        # not part of any project (its fail-on stays "never").
        if hasattr(args, "isolated") and args.command != "demo":
            from nndoctor.core.config import apply

            apply(args, argv)
        return int(handler(args) or 0)
    except UsageError as error:
        from nndoctor.util.sanitize import printable  # messages quote file names: no raw escapes

        print(f"nndoctor: error: {printable(str(error), keep_newlines=False)}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("nndoctor: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
