"""``nndoctor preflight [OPTIONS] SCRIPT [ARGS...]``: run the script up to its first optimizer
step, run the active tests on copies of the model there, report and stop.

Options and exit statuses are those of ``nndoctor run`` (``run --preflight`` runs the same
tests and then lets the training go on).
"""

from __future__ import annotations

import argparse

from nndoctor.run import cli as runner_cli


def configure(parser: argparse.ArgumentParser) -> None:
    runner_cli.configure(parser)
    parser.usage = "nndoctor preflight [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]"


def run(args: argparse.Namespace) -> int:
    args.preflight_stop = True
    return runner_cli.run(args)
