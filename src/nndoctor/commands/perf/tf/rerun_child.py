"""``python -m nndoctor.commands.perf.tf.rerun_child``: one ``--try`` timing of a Keras/TensorFlow script —
run again, unchanged, with the changes of ``tf_inject.py`` injected, stopped after the window.

Writes the same JSON object as ``rerun_child`` (seconds per step, first and final loss,
applied changes and notes, or the error), so ``rerun.try_changes`` compares it the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from nndoctor.commands.perf.tf.inject import TfChangeInjector, TfRerunSession, TfStepClock
from nndoctor.run.runner import Target, run_target
from nndoctor.util.atomic import atomic_write_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nndoctor.commands.perf.tf.rerun_child")
    parser.add_argument("--changes", default="")
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("-m", dest="module")
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.target[1:] if args.target[:1] == ["--"] else args.target
    target = Target(args.module, rest, is_module=True) if args.module else Target(rest[0], rest[1:])
    warmup = max(1, args.warmup)
    session = TfRerunSession(checks=[], max_steps=warmup + args.steps)
    injector = TfChangeInjector([c for c in args.changes.split(",") if c])
    clock = session.clock = TfStepClock(injector, warmup, args.steps)
    session.subscribe(injector)
    out_path = os.path.abspath(args.out)
    report = run_target(target, session)
    result: dict[str, Any] = {
        "status": report.status,
        "seconds_per_step": clock.seconds_per_step,
        "first_loss": clock.first_loss,
        "final_loss": clock.final_loss,
        "steps_seen": clock.count,
        "applied": injector.applied,
        "notes": injector.notes,
        "internal_errors": [e.error for e in report.internal_errors],
    }
    if report.status == "crashed" and report.traceback:
        result["error"] = report.traceback.strip().splitlines()[-1][:500]
    elif clock.seconds_per_step is None:
        result["error"] = (f"the script ended after {clock.count} optimizer steps, before the "
                           f"{warmup} + {args.steps} steps of the window")
    atomic_write_text(out_path, json.dumps(result))
    return 0


if __name__ == "__main__":
    status = main()
    # The result is written. A script stopped mid-epoch may leave tf.data threads inside a
    # py_function/numpy_function (a parallel map): at interpreter exit they wait for the GIL
    # and the process never ends (measured with --try parallel-map on such a map). Nothing
    # of the re-run is left to save, so leave without the interpreter's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
