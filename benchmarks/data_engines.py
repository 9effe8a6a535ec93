"""Files/s of ``nndoctor data`` with the local process pool and with ``--engine ray``, 1 and 2 workers.

    python benchmarks/data_engines.py --images 2000 --out benchmarks/results/data_engines.json

Generates the photo-like ImageFolder tree of ``datascan.py`` (96–512 px JPEGs, train/val,
10 classes, its injected defects) and the same images as WebDataset shards (1,000 per shard),
then runs ``nndoctor data … --no-cache --workers W [--engine ray]`` as separate processes,
alternating the configurations, and reports the scan's own files/s (from the JSON report:
the scan, pool start included, and without the pool's start) and the end-to-end wall time (interpreter, imports and, for
Ray, starting the local Ray instance). Also checks that every configuration gives the same
findings.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from datascan import generate_dataset  # noqa: E402


def write_shards(root: Path, out: Path, per_shard: int = 1000) -> str:
    files = sorted(root.rglob("*.jpg"))
    out.mkdir(parents=True, exist_ok=True)
    shards = 0
    for start in range(0, len(files), per_shard):
        with tarfile.open(out / f"train-{shards:06d}.tar", "w") as archive:
            for k, path in enumerate(files[start:start + per_shard]):
                key = f"{start + k:08d}"
                for ext, data in (("jpg", path.read_bytes()), ("cls", path.parent.name.encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
        shards += 1
    return str(out / f"train-{{000000..{shards - 1:06d}}}.tar")


def run(paths: list[str], workers: int, engine: str, report: Path) -> dict:
    command = [sys.executable, "-m", "nndoctor", "data", *paths, "--no-cache", "--workers", str(workers),
               "--engine", engine, "--json", str(report)]
    started = time.perf_counter()
    subprocess.run(command, check=False, capture_output=True)
    wall = time.perf_counter() - started
    data = json.loads(report.read_text())
    scan = data["extra"]["scan"]
    files = scan["files_scanned"] + scan["records"]
    return {"engine": engine, "workers": workers, "files": files, "scan_seconds": scan["seconds"],
            "files_per_second": scan["files_per_second"], "pool_start_seconds": scan["pool_start_seconds"],
            "files_per_second_after_start": scan["files_per_second_after_start"], "wall_seconds": round(wall, 2),
            "findings": sorted((f["code"], f["message"]) for f in data["findings"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="nndoctor-engines-"))
    root = work / "images"
    if not root.exists():
        generate_dataset(root, args.images, os.cpu_count() or 1)
    pattern = write_shards(root, work / "shards")
    results = []
    for _ in range(args.rounds):
        for dataset, paths in (("imagefolder", [str(root)]), ("webdataset", [pattern])):
            for engine in ("local", "ray"):
                for workers in (1, 2):
                    row = run(paths, workers, engine, work / "report.json")
                    row["dataset"] = dataset
                    results.append(row)
                    print(f"{dataset:12} {engine:5} workers={workers} files={row['files']} "
                          f"scan {row['files_per_second']} files/s ({row['scan_seconds']} s), "
                          f"after the pool's start ({row['pool_start_seconds']} s) "
                          f"{row['files_per_second_after_start']} files/s, "
                          f"wall {row['wall_seconds']} s", flush=True)
    for dataset in ("imagefolder", "webdataset"):
        same = {json.dumps(r["findings"]) for r in results if r["dataset"] == dataset}
        print(f"{dataset}: identical findings across engines and workers: {len(same) == 1}")
    summary = {}
    for r in results:
        summary.setdefault((r["dataset"], r["engine"], r["workers"]), []).append(
            (r["files_per_second"], r["files_per_second_after_start"]))
    for key, values in summary.items():
        print(*key, "median files/s", statistics.median(v[0] for v in values),
              "after start", statistics.median(v[1] for v in values))
    if args.out:
        args.out.write_text(json.dumps([{k: v for k, v in r.items() if k != "findings"} for r in results], indent=1))


if __name__ == "__main__":
    main()
