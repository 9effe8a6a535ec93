"""What one sampled step costs, per check family: every step sampled, one family at a time.

`overhead.py` gives the steady-state ratio that users pay (sampled steps are 1 in 100); this
script explains it. With ``NNDOCTOR_SAMPLE_EVERY=1`` every step after the 16-step window is a
sampled step, so the extra time per step over a plain loop is the cost of a sampled step
with the selected checks. Rounds alternate plain / each selection; medians are printed.

    python benchmarks/sampled_step_cost.py --device cuda --model resnet50 --amp bf16 \\
        --channels-last --batch 128 --image-size 224        # the table in benchmarks/README.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

os.environ["NNDOCTOR_SAMPLE_EVERY"] = "1"  # read when nndoctor is imported


sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # noqa: E402  (the same model and step as the overhead benchmark)

DEFAULT_SELECTIONS = "none,all,N101,N103,N104,D101,D104,D,L,O,M,B,P,R,C"


def measure(args, device, selection: str) -> float:
    import nndoctor
    from nndoctor.core.engine import DEFAULT_FULL_WINDOW

    step = overhead.make_side(args, device)
    warmup = max(args.warmup, DEFAULT_FULL_WINDOW)  # past the window: steps sampled, not "full"
    if selection == "plain":
        for i in range(warmup):
            step(i)
        return overhead.timed_steps(step, warmup, args.steps, device)
    kwargs = {"ignore": ["ALL"]} if selection == "none" else {} if selection == "all" else {
        "select": selection.split("+")}
    with nndoctor.watch(**kwargs) as report:
        for i in range(warmup):
            step(i)
        seconds = overhead.timed_steps(step, warmup, args.steps, device)
    if report.internal_errors:
        print(f"{selection}: internal errors {report.internal_errors[:1]}", file=sys.stderr)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    overhead.add_setup_arguments(parser)
    parser.add_argument("--selections", default=DEFAULT_SELECTIONS,
                        help="comma-separated: none (engine only), all, or check codes/prefixes ('+' joins)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    device = overhead.setup_device(args)
    selections = ["plain"] + args.selections.split(",")
    times: dict[str, list[float]] = {s: [] for s in selections}
    for r in range(args.rounds):
        for selection in (selections if r % 2 == 0 else selections[::-1]):
            times[selection].append(measure(args, device, selection))
    plain = statistics.median(times["plain"])
    card = overhead.card_name(device)
    print(f"{card}: plain {plain * 1e3:.2f} ms/step; every step sampled ({args.rounds} rounds × {args.steps} steps)")
    print(f"{'checks':<10} {'ms/step':>9} {'extra ms':>9}")
    for selection in selections[1:]:
        median = statistics.median(times[selection])
        print(f"{selection:<10} {median * 1e3:9.2f} {(median - plain) * 1e3:+9.2f}")


if __name__ == "__main__":
    main()
