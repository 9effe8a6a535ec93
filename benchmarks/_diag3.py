"""Temporary diagnostic (not committed): loader-bound cost of nndoctor run / perf, pinned or not."""
import json, shutil, statistics, sys, tempfile
from pathlib import Path
sys.path.insert(0, "benchmarks")
import perf_advice as pa

work = Path(tempfile.mkdtemp(prefix="nndoctor_diag3_"))
try:
    (work / "train.py").write_text(pa.TRAIN_SCRIPT)
    pa.make_dataset(work / "data", 5000)
    base = "--workers 12 --persistent --sync-every 100 --amp --channels-last".split()
    cases = {"pinned": base + ["--pin"], "unpinned": base}
    modes = {"plain": None, "run": ["run", "--fail-on", "never", "--quiet"],
             "perf": ["perf", "--warmup", "0", "--steps", "100000", "--quiet"]}
    res = {}
    for r in range(int(sys.argv[1])):
        for case, flags in cases.items():
            order = list(modes.items())
            for mode, prefix in (order if r % 2 == 0 else order[::-1]):
                run = pa.run_script(work, ["--warmup-steps", "5", "--steps", "60", *flags], nndoctor=prefix)
                res.setdefault(f"{case}/{mode}", []).append(run["images_per_s"])
                if run["images_per_s"] is None:
                    print(run["stderr_tail"][-800:])
    for k, xs in res.items():
        print(k, statistics.median([x for x in xs if x] or [0]), xs, flush=True)
finally:
    shutil.rmtree(work, ignore_errors=True)
