"""``nndoctor fix [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]``: run the doctor, then edit the source.

By default the edits are printed as a unified diff and nothing is written. ``--write`` applies
them (atomically, with a ``.nndoctor.bak`` backup unless ``--no-backup``); ``--verify`` (which
implies ``--write``) re-runs the patched script under the doctor and rolls back every edit that
did not remove its finding or brought a new error or warning. Unsafe fixes (behaviour changes
beyond the bug) are only suggested unless ``--unsafe-fixes``.

Exit status: as ``nndoctor run``, judged on the last run (after ``--verify``) or on the first
run without the findings whose edits were written.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import linecache
import os
import sys
from typing import IO, Any

from nndoctor.cli import add_common_options
from nndoctor.commands.fix.edit import APPLIED, ROLLED_BACK, VERIFIED, Edit
from nndoctor.commands.fix.files import (
    BACKUP_SUFFIX,
    backup,
    patched,
    read_source,
    unified_diff,
    write_source,
)
from nndoctor.core.config import session_options
from nndoctor.core.engine import Session
from nndoctor.core.findings import Report
from nndoctor.core.selection import fail_threshold, selectors
from nndoctor.report.delivery import ReportDelivery
from nndoctor.report.outputs import stdout_to_stderr
from nndoctor.run import watchdog
from nndoctor.run.cli import exit_status, target_from_args
from nndoctor.run.runner import Target, run_target
from nndoctor.util.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = "nndoctor fix [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]"
    add_common_options(parser)
    parser.add_argument("--max-steps", type=int, metavar="N",
                        help="stop the script cleanly after N optimizer steps (each run of it)")
    parser.add_argument("--write", action="store_true", help="apply the edits to the files (default: print a diff)")
    parser.add_argument("--verify", action="store_true",
                        help="apply the edits, re-run the script and keep only the edits that removed "
                             "their finding without a new error or warning (implies --write)")
    parser.add_argument("--unsafe-fixes", action="store_true",
                        help="also apply fixes that change behaviour beyond the bug (R101, O109)")
    parser.add_argument("--backup", action=argparse.BooleanOptionalAction, default=True,
                        help=f"keep each edited file's previous text as FILE{BACKUP_SUFFIX} (default: on)")
    watchdog.add_options(parser)
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    parser.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS ...]")


def doctor_run(target: Target, args: argparse.Namespace, *, history: bool = False) -> Report:
    """One run of the script under a fresh session, as ``nndoctor run`` would do it."""
    select, ignore = selectors(args)
    session = Session(select=select, ignore=ignore, command=target.command, max_steps=args.max_steps,
                      **session_options(args))
    watchdog.configure(session, args)
    if history:  # the plots of --html / --tensorboard, for the first run's report
        from nndoctor.run.history import attach as record_history

        record_history(session)
    return run_target(target, session)


def rerun_quietly(target: Target, args: argparse.Namespace, edited: list[str]) -> Report:
    """Run the patched script again; its own output is not shown a second time."""
    edited_real = {os.path.realpath(p) for p in edited}
    # A helper module of the user's that was edited must be imported afresh.
    for name, module in list(sys.modules.items()):
        filename = getattr(module, "__file__", None)
        if filename and os.path.realpath(filename) in edited_real:
            del sys.modules[name]
    linecache.clearcache()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return doctor_run(target, args)


def _summary(edits: list[Edit], *, wrote: bool, verified: bool) -> list[str]:
    lines = []
    for edit in sorted(edits, key=lambda e: (e.display_path, e.shown_range)):
        start, _ = edit.shown_range
        where = f"{edit.display_path}:{start}"
        if edit.is_suggestion:
            lines.append(f"  suggestion {edit.code} {where}: {edit.title} — not applied: {edit.reason}")
        elif edit.status == ROLLED_BACK:
            lines.append(f"  rolled back {edit.code} {where}: {edit.title} — {edit.reason}")
        else:
            state = {VERIFIED: "fixed and verified", APPLIED: "fixed"}.get(edit.status, "would fix")
            lines.append(f"  {state} {edit.code} {where}: {edit.title}{'' if edit.safe else ' (unsafe fix)'}")
    active = [e for e in edits if not e.is_suggestion]
    kept = [e for e in active if e.status in (APPLIED, VERIFIED)]
    if not edits:
        head = "nndoctor fix: nothing to fix"
    elif not active:
        head = f"nndoctor fix: no edit to make ({len(edits)} suggestion(s) to apply by hand)"
    elif not wrote:
        head = f"nndoctor fix: {len(active)} edit(s) proposed (nothing written; --write applies them)"
    else:
        head = f"nndoctor fix: {len(kept)} of {len(active)} edit(s) {'verified and ' if verified else ''}written"
    hidden = sum(1 for e in edits if e.is_suggestion and e.hunks and not e.safe)
    tail = [f"  {hidden} unsafe fix(es) available with --unsafe-fixes"] if hidden else []
    return [head, *lines, *tail]


def run(args: argparse.Namespace) -> int:
    from nndoctor.commands.fix.syntax import load_libcst
    from nndoctor.run.distributed import context as distributed

    load_libcst()  # a missing extra is a clear message before a long run
    target = target_from_args(args)
    if distributed.torchrun_rank() is not None:
        # Every rank would edit the same files at once.
        raise UsageError("nndoctor fix runs the script in one process: run it without torchrun")
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError("--max-steps must be at least 1")
    if not target.is_module and target.name.endswith(".ipynb"):
        from nndoctor.commands.fix.notebook import script_for

        with script_for(target.name) as converted:
            return _fix(Target(converted.script_path, target.args), args, notebook=converted, shown=target.name)
    return _fix(target, args)


def _fix(target: Target, args: argparse.Namespace, notebook: Any = None, shown: str = "") -> int:
    from nndoctor.commands.fix.plan import plan_edits

    write = args.write or args.verify
    output = ReportDelivery.from_args(args, also_scan=[] if target.is_module or notebook else [target.name])
    to_stdout_json = args.json == "-" or args.output_format == "json"
    stream: IO[str] = sys.stderr if to_stdout_json else sys.stdout
    try:
        with stdout_to_stderr(to_stdout_json):
            baseline = doctor_run(target, args, history=bool(args.html or args.tensorboard))
        named = [] if target.is_module else [target.name]
        edits = plan_edits(baseline, project_root=os.getcwd(), named=named, unsafe=args.unsafe_fixes)
        diff = io.StringIO()
        final = fix_files(edits, baseline, write=write, verify=args.verify,
                          keep_backup=args.backup and notebook is None,
                          rerun=lambda paths: rerun_quietly(target, args, paths),
                          stream=diff if notebook is None else None)
        baseline.edits = edits
        if notebook is not None:
            _back_to_notebook(notebook, shown, edits, baseline, write=write, keep_backup=args.backup, diff=diff)
        output.deliver(baseline)
        stream.write(diff.getvalue())
        for line in _summary(edits, wrote=write, verified=args.verify):
            print(line, file=stream)
    finally:
        output.close()
    return exit_status(final, fail_threshold(args))


def _back_to_notebook(notebook: Any, shown: str, edits: list[Edit], report: Report, *, write: bool,
                      keep_backup: bool, diff: IO[str]) -> None:
    """Cell by cell: the diff of each changed cell, and (with --write) the notebook rewritten."""
    from nndoctor.commands.fix.notebook import show_cells

    kept = [e for e in edits if not e.is_suggestion and e.status != ROLLED_BACK]
    script = read_source(notebook.script_path) if write else patched(notebook.script, kept)
    diff.write(notebook.cell_diff(script, shown))
    if write:
        notebook.write_back(script, keep_backup)
    report.command = [shown, *report.command[1:]]
    show_cells(report, notebook, shown)


def fix_files(edits: list[Edit], baseline: Report, *, write: bool, verify: bool, keep_backup: bool,
              rerun, stream: IO[str] | None = None) -> Report:
    """Show the diff, and with ``write`` apply (and with ``verify`` prove) the edits.

    Returns the report that judges the result: the verification run, or the first run without
    the findings whose edits were written."""
    active = [e for e in edits if not e.is_suggestion]
    paths = sorted({e.path for e in active})
    originals = {path: read_source(path) for path in paths}
    try:
        return _apply(active, paths, originals, baseline, write=write, verify=verify, keep_backup=keep_backup,
                      rerun=rerun)
    finally:
        # The diff of what is proposed, or (after --verify) of what was kept.
        for path in paths:
            mine = [e for e in active if e.path == path and e.status != ROLLED_BACK]
            shown = next(e.display_path for e in active if e.path == path)
            diff = unified_diff(path, originals[path], patched(originals[path], mine), shown)
            if stream is not None and diff:
                stream.write(diff)


def _apply(active: list[Edit], paths: list[str], originals: dict[str, str], baseline: Report, *,
           write: bool, verify: bool, keep_backup: bool, rerun) -> Report:
    from nndoctor.commands.fix.verify import verify as verify_edits

    if not write or not active:
        return baseline
    for path in paths:
        if keep_backup:
            backup(path, originals[path])
        write_source(path, patched(originals[path], [e for e in active if e.path == path]))
    for edit in active:
        edit.status = APPLIED
    if verify:
        try:
            return verify_edits(active, originals, baseline, rerun=lambda: rerun(paths))
        except BaseException:
            # Interrupted (or failed) half-way: no unverified edit stays in the user's files.
            for path in paths:
                write_source(path, originals[path])
            for edit in active:
                edit.status, edit.reason = ROLLED_BACK, "rolled back: the verification did not finish"
            raise
    fixed = {id(f) for e in active for f in e.findings}
    return Report(command=baseline.command, status=baseline.status, steps=baseline.steps,
                  findings=[f for f in baseline.findings if id(f) not in fixed],
                  exit_code=baseline.exit_code)
