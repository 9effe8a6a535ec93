"""Distributed robustness on GPUs (issue 30 items 2, 3, 5): the scenarios the CPU tests cover with
gloo, run with NCCL on a 2-GPU machine. Each scenario launches real torchrun processes under
`-m nndoctor run`, reads the merged JSON report and says PASS or FAIL with the reason.

    PYTHONPATH=$PWD/src python benchmarks/ddp_robustness_gpu.py --out "$OUT"     # ≈ 2–4 min
    # CPU smoke run of the same driver (gloo; FSDP 1 and NCCL-only scenarios skipped):
    PYTHONPATH=$PWD/src python benchmarks/ddp_robustness_gpu.py --device cpu --out /tmp/robust

Scenarios:
- two_nodes_nccl: two torchrun invocations on one host (--nnodes 2, one GPU each via
  CUDA_VISIBLE_DEVICES, separate TMPDIRs as two machines have), DDP without DistributedSampler:
  node 0 prints one merged report with both ranks and X101; node 1 writes nothing.
- fsdp2_nccl: fully_shard on 2 GPUs, a loop without zero_grad: no internal error, O101 on both ranks.
- fsdp1_nccl: FullyShardedDataParallel on 2 GPUs, a correct loop: no internal error, no error finding.
- rank_abort_nccl: rank 1 calls os.abort() (SIGABRT) while it waits in an NCCL all_reduce that
  rank 0 joins later: the report names rank 1 (X113, SIGABRT, all_reduce at its line).
- mismatch_nccl: only rank 0 all-reduces at an epoch's end (NCCL hangs until its 60 s timeout);
  with --stall-seconds 10 --stall-action stop both ranks stall and are stopped, and rank 0 still
  delivers one merged report (both ranks, R104, X110 from the flight records at that line).
  On --device cpu gloo aborts on the mismatched sizes instead: one merged report with X110 (and
  X113 for the rank that died) at that line.

Writes <out>/ddp_robustness_gpu.json (per scenario: status, seconds, reason, the findings' codes)
and each scenario's report and torchrun output under <out>/<scenario>/.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

PRELUDE = '''
import os, signal, threading, time, datetime
import torch
import torch.distributed as dist
from torch import nn
DEVICE = os.environ.get("ROBUST_DEVICE", "cuda")
BACKEND = "nccl" if DEVICE == "cuda" else "gloo"
dist.init_process_group(BACKEND, timeout=datetime.timedelta(seconds=int(os.environ.get("ROBUST_TIMEOUT", "60"))))
rank = dist.get_rank()
local = int(os.environ.get("LOCAL_RANK", "0"))
device = torch.device(DEVICE, local) if DEVICE == "cuda" else torch.device("cpu")
if DEVICE == "cuda":
    torch.cuda.set_device(device)
torch.manual_seed(0)
'''

SCRIPTS = {
    "same_batches.py": '''
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
data = TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,)))
loader = DataLoader(data, batch_size=16)  # no DistributedSampler: identical batches on every rank
model = DDP(nn.Linear(32, 4).to(device), device_ids=[local] if DEVICE == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
''',
    "fsdp2_no_zero_grad.py": '''
from torch.distributed.fsdp import fully_shard
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(24):
    x = torch.randn(16, 32, device=device)
    y = torch.randint(0, 4, (16,), device=device)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()          # no optimizer.zero_grad(): O101
    optimizer.step()
dist.destroy_process_group()
''',
    "fsdp1_correct.py": '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = FSDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device), device_id=device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(24):
    x = torch.randn(16, 32, device=device) + rank
    y = torch.randint(0, 4, (16,), device=device)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
''',
    "rank_abort.py": '''
model = nn.Linear(32, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(16, 32, device=device)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if DEVICE == "cuda":
    torch.cuda.synchronize()
if rank == 1:
    threading.Timer(2.0, os.abort).start()
else:
    time.sleep(6)
metric = torch.zeros(3, device=device)
dist.all_reduce(metric)  # ROBUST_ABORT_LINE
if DEVICE == "cuda":
    torch.cuda.synchronize()
dist.destroy_process_group()
''',
    "mismatch.py": '''
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(nn.Linear(32, 4).to(device), device_ids=[local] if DEVICE == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    total = torch.zeros(1, device=device)
    for i in range(4):
        loss = model(torch.randn(16, 32, device=device)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()
    if rank == 0:
        dist.all_reduce(total)  # ROBUST_MISMATCH_LINE
    if DEVICE == "cuda":
        torch.cuda.synchronize()
dist.destroy_process_group()
''',
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_scripts(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, body in SCRIPTS.items():
        path = folder / name
        path.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(body))
        paths[name] = path
    return paths


def marked_line(path: Path, mark: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if mark in line)


def torchrun(out: Path, script: Path, *, nproc: int, env: dict[str, str], launcher: list[str] | None = None,
             options: tuple[str, ...] = (), timeout: float = 240) -> tuple[int, str, dict[str, Any] | None]:
    out.mkdir(parents=True, exist_ok=True)
    report = out / "report.json"
    command = [sys.executable, "-m", "torch.distributed.run", *(launcher or ["--standalone"]),
               f"--nproc_per_node={nproc}", "-m", "nndoctor", "run", "--json", str(report), *options, str(script)]
    with open(out / "torchrun.txt", "w") as log:
        result = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, cwd=out)
    text = (out / "torchrun.txt").read_text(errors="replace")
    return result.returncode, text, json.loads(report.read_text()) if report.exists() else None


def codes(report: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {f["code"]: f for f in (report or {}).get("findings", [])}


def scenario_two_nodes(out: Path, scripts: dict[str, Path], env: dict[str, str], device: str) -> str | None:
    port = free_port()
    processes = []
    for node in (0, 1):
        folder = out / f"node{node}"
        folder.mkdir(parents=True, exist_ok=True)
        node_env = dict(env, TMPDIR=str(folder))
        if device == "cuda":
            node_env["CUDA_VISIBLE_DEVICES"] = str(node)
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
                   "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                   "-m", "nndoctor", "run", "--json", str(folder / "report.json"), str(scripts["same_batches.py"])]
        log = open(folder / "torchrun.txt", "w")  # noqa: SIM115 - closed below
        processes.append((subprocess.Popen(command, env=node_env, stdout=log, stderr=subprocess.STDOUT, cwd=folder), log))
    for process, log in processes:
        process.wait(timeout=240)
        log.close()
    if any(p.returncode for p, _ in processes):
        return f"torchrun exit statuses {[p.returncode for p, _ in processes]}"
    if (out / "node1" / "report.json").exists():
        return "node 1 wrote a report too"
    report = json.loads((out / "node0" / "report.json").read_text())
    if sorted(r["rank"] for r in report["ranks"]) != [0, 1] or report["missing_ranks"]:
        return f"ranks {report['ranks']} missing {report['missing_ranks']}"
    found = codes(report).get("X101")
    if not found or found["ranks"] != [0, 1]:
        return f"no X101 on ranks 0, 1: {sorted(codes(report))}"
    if report["internal_errors"]:
        return f"internal errors: {report['internal_errors'][:2]}"
    return None


def scenario_fsdp2(out: Path, scripts: dict[str, Path], env: dict[str, str], device: str) -> str | None:
    status, text, report = torchrun(out, scripts["fsdp2_no_zero_grad.py"], nproc=2, env=env)
    if report is None:
        return f"no report (exit {status}): {text[-1500:]}"
    if report["internal_errors"]:
        return f"internal errors: {report['internal_errors'][:2]}"
    found = codes(report).get("O101")
    if not found or found["ranks"] != [0, 1]:
        return f"no O101 on ranks 0, 1: {sorted(codes(report))}"
    return None


def scenario_fsdp1(out: Path, scripts: dict[str, Path], env: dict[str, str], device: str) -> str | None:
    status, text, report = torchrun(out, scripts["fsdp1_correct.py"], nproc=2, env=env)
    if report is None or status:
        return f"exit {status}, report {'present' if report else 'missing'}: {text[-1500:]}"
    if report["internal_errors"]:
        return f"internal errors: {report['internal_errors'][:2]}"
    errors = [f["code"] for f in report["findings"] if f["severity"] == "error"]
    return f"error findings on a correct FSDP run: {errors}" if errors else None


def scenario_abort(out: Path, scripts: dict[str, Path], env: dict[str, str], device: str) -> str | None:
    script = scripts["rank_abort.py"]
    status, text, report = torchrun(out, script, nproc=2, env=dict(env, ROBUST_TIMEOUT="60"),
                                    launcher=["--standalone", "--redirects", "3", "--log-dir", str(out / "logs")])
    if report is None:
        return f"no report (exit {status}): {text[-1500:]}"
    died = codes(report).get("X113")
    if died is None:
        return f"no X113: {sorted(codes(report))}; ranks {[(r['rank'], r['status']) for r in report['ranks']]}"
    evidence = died["evidence"]
    line = marked_line(script, "ROBUST_ABORT_LINE")
    problems = []
    if died["ranks"] != [1] or evidence["signal"] != "SIGABRT":
        problems.append(f"ranks {died['ranks']} signal {evidence['signal']}")
    if (evidence.get("flight") or {}).get("op") != "all_reduce" or (died.get("location") or {}).get("line") != line:
        problems.append(f"flight {evidence.get('flight')} location {died.get('location')} (expected line {line})")
    return "; ".join(problems) or None


def scenario_mismatch(out: Path, scripts: dict[str, Path], env: dict[str, str], device: str) -> str | None:
    script = scripts["mismatch.py"]
    # NCCL hangs on a mismatch until its timeout, then its watchdog aborts every rank: nndoctor's
    # stall watchdog (10 s, well before the 60 s NCCL timeout) reports where each rank waits.
    status, text, report = torchrun(out, script, nproc=2, env=dict(env, ROBUST_TIMEOUT="60"),
                                    launcher=["--standalone", "--redirects", "3", "--log-dir", str(out / "logs")],
                                    options=("--stall-seconds", "10", "--stall-action", "stop"))
    if report is None:
        return f"no report (exit {status}): {text[-1500:]}"
    found = codes(report)
    ranks = [(r["rank"], r["status"]) for r in report.get("ranks", [])]
    if sorted(rank for rank, _ in ranks) != [0, 1]:
        return f"not one merged report of ranks 0, 1: status {report['status']}, ranks {ranks}, {sorted(found)}"
    if device == "cuda" and (report["status"] != "stalled" or "R104" not in found):
        return f"expected a stalled run with R104: status {report['status']}, {sorted(found)}"
    mismatch = found.get("X110")
    line = marked_line(script, "ROBUST_MISMATCH_LINE")
    if mismatch is None:
        return f"no X110: {sorted(found)}; ranks {ranks}"
    if (mismatch.get("location") or {}).get("line") != line or mismatch["ranks"] != [0, 1]:
        return f"X110 at {mismatch.get('location')} on ranks {mismatch['ranks']} (expected line {line}): {mismatch['message']}"
    return None


SCENARIOS = {
    "two_nodes": scenario_two_nodes,
    "fsdp2": scenario_fsdp2,
    "fsdp1": scenario_fsdp1,
    "rank_abort": scenario_abort,
    "mismatch": scenario_mismatch,
}
CUDA_ONLY = {"fsdp1"}  # FullyShardedDataParallel needs an accelerator


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "robustness-out"))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    out = Path(args.out)
    scripts = write_scripts(out / "scripts")
    env = dict(os.environ, ROBUST_DEVICE=args.device, OMP_NUM_THREADS="1")
    env.pop("NNDOCTOR_PARTS_DIR", None)
    results: dict[str, Any] = {"device": args.device}
    if args.device == "cuda":
        import torch

        results["cards"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        results["torch"] = torch.__version__
    failed = 0
    for name, scenario in SCENARIOS.items():
        if args.only and name not in args.only:
            continue
        if name in CUDA_ONLY and args.device != "cuda":
            results[name] = {"status": "SKIP", "reason": "needs CUDA"}
            continue
        started = time.monotonic()
        try:
            problem = scenario(out / name, scripts, env, args.device)
        except Exception as error:  # noqa: BLE001 - a scenario's own failure is its result
            problem = f"{type(error).__name__}: {error}"
        seconds = round(time.monotonic() - started, 1)
        report_path = out / name / ("node0" if name == "two_nodes" else "") / "report.json"
        found = sorted(codes(json.loads(report_path.read_text()))) if report_path.exists() else []
        results[name] = {"status": "FAIL" if problem else "PASS", "seconds": seconds, "reason": problem,
                         "codes": found}
        failed += bool(problem)
        print(f"{name:12s} {'FAIL' if problem else 'PASS'}  {seconds:6.1f} s  {found}  {problem or ''}", flush=True)
    (out / "ddp_robustness_gpu.json").write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
