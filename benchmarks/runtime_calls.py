"""What nndoctor adds to a launch-bound GPU step, counted in CUDA runtime calls and ATen ops.

Wall-clock ratios on a shared GPU host move by ±25% from launch to launch (benchmarks/README.md),
too much to see a change of a few microseconds a step. This counts instead: the MLP patient of
``ddp_overhead.py`` (64 → 4×256 → 10, batch 32 from a DataLoader over device-resident data,
Adam, ``loss.item()`` every step) runs in one process, plain and then under every check
(``install(Session())``), and ``torch.profiler`` records a window of unsampled steps of each;
printed per step: the operators and CUDA runtime calls (``cudaLaunchKernel``,
``cudaMemcpyAsync``, ``cudaEventRecord`` …) whose count or host time differs, largest first.
Two windows: steps 300–400 (L108's chance ledger still recording) and 2,100–2,200 (after it).

    python benchmarks/runtime_calls.py                    # on a GPU, ~1 minute
    python benchmarks/runtime_calls.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

WINDOWS = tuple((int(a), int(b)) for a, b in (w.split("-") for w in os.environ.get("RUNTIME_CALLS_WINDOWS", "300-400,2100-2200").split(",")))


def build(device):
    """The MLP patient of ``ddp_overhead.py``, built by it (the same model, teacher labels and
    loader), with Adam and cross-entropy as there."""
    import torch
    from torch import nn

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ddp_overhead import _model_and_batches

    torch.manual_seed(0)
    patient = argparse.Namespace(model="mlp", labels="teacher", batch=32)
    model, batches = _model_and_batches(patient, torch.device(device), 0)
    return model, batches, torch.optim.Adam(model.parameters(), lr=1e-3), nn.CrossEntropyLoss()


def profile_run(doctored: bool, device: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    session = installation = None
    if doctored:
        from nndoctor.core.engine import Session
        from nndoctor.instrument.extensions import install

        session = Session()
        installation = install(session)
    model, batches, optimizer, criterion = build(device)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()
    results = {}
    try:
        step = 0
        for first, last in WINDOWS:
            while step < last:
                if step == first:
                    sync()
                    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
                    prof.__enter__()
                    began = time.perf_counter()
                x, y = next(batches)
                optimizer.zero_grad(set_to_none=True)
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                loss.item()
                step += 1
            sync()
            seconds = time.perf_counter() - began
            prof.__exit__(None, None, None)
            steps = last - first
            table = {}
            for item in prof.key_averages():
                table[item.key] = (item.count / steps, item.self_cpu_time_total / steps)
            results[f"{first}-{last}"] = {"ms_per_step": seconds / steps * 1e3, "ops": table}
    finally:
        if session is not None:
            from nndoctor.run.end import finish

            finish(session, installation, "completed", None)
            results["internal_errors"] = len(session.report.internal_errors)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    plain = profile_run(False, args.device)
    doctored = profile_run(True, args.device)
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
           "plain": plain, "doctored": doctored}
    print(f"{out['device']}, torch {out['torch']}; internal errors: {doctored.get('internal_errors')}")
    for window in (f"{a}-{b}" for a, b in WINDOWS):
        p, d = plain[window], doctored[window]
        print(f"\nsteps {window}: plain {p['ms_per_step']:.3f} ms/step (under the profiler), doctored {d['ms_per_step']:.3f}")
        rows = []
        for key in set(p["ops"]) | set(d["ops"]):
            pc, pt = p["ops"].get(key, (0.0, 0.0))
            dc, dt = d["ops"].get(key, (0.0, 0.0))
            if abs(dc - pc) > 0.005 or abs(dt - pt) > 1.0:
                rows.append((dt - pt, dc - pc, pc, dc, key))
        rows.sort(key=lambda r: -abs(r[0]))
        print("  extra µs/step  extra calls/step  plain  doctored  name")
        for extra_us, extra_calls, pc, dc, key in rows[:args.top]:
            print(f"  {extra_us:12.1f}  {extra_calls:16.2f}  {pc:5.2f}  {dc:8.2f}  {key[:70]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    main()
