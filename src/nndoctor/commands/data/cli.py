"""``nndoctor data PATH...``: check image folders or TFRecord files before training."""

from __future__ import annotations

import argparse
import sys

from nndoctor.catalog.table import is_enabled
from nndoctor.cli import add_common_options
from nndoctor.commands.data.analyze import NEAR_DISTANCE, AnalysisOptions, image_findings
from nndoctor.commands.data.checks import CrossSplitDuplicates
from nndoctor.commands.data.layout import plan
from nndoctor.commands.data.records import ReadOptions
from nndoctor.commands.data.scan import ScanOptions, available_cpus, scan
from nndoctor.commands.data.tfrecord_analyze import tfrecord_findings
from nndoctor.core.findings import Report
from nndoctor.core.selection import fail_threshold, filter_findings, selectors
from nndoctor.report.delivery import ReportDelivery
from nndoctor.util.errors import UsageError
from nndoctor.util.sanitize import printable


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", metavar="PATH",
        help="a folder of class folders, a folder of split folders (train/ val/ test/), several "
             "folders (one split each), a flat folder of images, TFRecord files/globs, HDF5 files, "
             "LMDB folders, WebDataset shards (shard-{000000..000127}.tar), Parquet files, .npy/.npz "
             "arrays; local paths or s3://, gs:// … URLs",
    )
    parser.add_argument("--images", metavar="KEY",
                        help="HDF5 dataset, .npz array or Parquet column holding the images (default: found by name and shape)")
    parser.add_argument("--labels", metavar="KEY",
                        help="HDF5 dataset, .npz array or Parquet column holding the labels (default: found by name)")
    parser.add_argument("--engine", choices=("local", "ray"), default="local",
                        help="local: a process pool (default); ray: the per-file work on Ray Data")
    parser.add_argument("--address", metavar="ADDRESS",
                        help="with --engine ray: the cluster (ray://host:10001, host:6379 or auto); default: a local Ray")
    parser.add_argument("--crop", type=int, metavar="N", help="training crop size: list images smaller than N×N (F103)")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="worker processes (default and maximum: the CPUs available)")
    parser.add_argument("--no-cache", action="store_true", help="read every file; do not use or update the scan cache")
    parser.add_argument(
        "--near-distance", type=int, default=NEAR_DISTANCE, metavar="BITS",
        help=f"perceptual-hash distance for cross-split near duplicates (default {NEAR_DISTANCE} of 64; F110)",
    )
    add_common_options(parser)


def _command(args: argparse.Namespace) -> list[str]:
    command = ["nndoctor", "data", *args.paths]
    if args.crop is not None:
        command += ["--crop", str(args.crop)]
    if args.workers:
        command += ["--workers", str(args.workers)]
    if args.no_cache:
        command.append("--no-cache")
    for option in ("images", "labels", "address"):
        if getattr(args, option):
            command += [f"--{option}", getattr(args, option)]
    if args.engine != "local":
        command += ["--engine", args.engine]
    return command


def run(args: argparse.Namespace) -> int:
    select, ignore = selectors(args)
    fail_on = fail_threshold(args)
    if args.crop is not None and args.crop < 1:
        raise UsageError("--crop must be a positive number of pixels")
    if args.workers < 0:
        raise UsageError("--workers must be 0 (all cores) or more")
    if args.address and args.engine != "ray":
        raise UsageError("--address needs --engine ray")
    if not 0 <= args.near_distance <= 32:
        raise UsageError("--near-distance must be between 0 and 32 bits")
    output = ReportDelivery.from_args(args, text_stream="stdout")  # a bad --json path fails before the scan
    cpus = available_cpus()
    if args.workers > cpus:
        print(f"nndoctor: note: --workers {args.workers} capped at {cpus}, the CPUs available", file=sys.stderr)
        args.workers = cpus
    layout = plan(args.paths)
    near_enabled = is_enabled(CrossSplitDuplicates, select, ignore)
    options = ScanOptions(workers=args.workers, use_cache=not args.no_cache, engine=args.engine,
                          address=args.address, read=ReadOptions(images=args.images, labels=args.labels))
    result = scan(layout, options)
    for note in layout.ignored + result.notes:
        print(f"nndoctor: note: {printable(note, keep_newlines=False)}", file=sys.stderr)
    stats = result.stats
    if layout.records and not stats["records"] and not stats["files_scanned"] and not stats["tfrecord_files"]:
        result.close()
        raise UsageError(f"nothing to check in {', '.join(args.paths)}: the files hold no image records "
                         "(WebDataset shards need key.jpg/.png/… members; HDF5, NumPy, Parquet and LMDB "
                         "need images)")
    try:
        analysis = AnalysisOptions(crop=args.crop, near_distance=args.near_distance, near_duplicates=near_enabled)
        findings = image_findings(result, analysis) + tfrecord_findings(result.tfrecords)
    finally:
        result.close()
    cache_state = result.stats.get("cache")
    if isinstance(cache_state, str) and cache_state.startswith("cache disabled"):
        print(f"nndoctor: note: {printable(cache_state, keep_newlines=False)}; every file was read",
              file=sys.stderr)
    report = Report(command=_command(args), status="completed", steps=0)
    for finding in findings:
        report.add(finding)
    filter_findings(report, select, ignore)
    report.extra = {"scan": result.stats, "splits": [s.name for s in layout.splits]}
    # With --json -, stdout carries the JSON alone; the readable report moves to stderr.
    try:
        output.deliver(report)
    finally:
        output.close()
    return 1 if report.reaches(fail_on) else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m nndoctor.commands.data``: the same command without loading the other subcommands."""
    parser = argparse.ArgumentParser(prog="nndoctor data", description=__doc__.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UsageError as error:
        print(f"nndoctor: error: {printable(str(error), keep_newlines=False)}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("nndoctor: interrupted", file=sys.stderr)
        return 130
