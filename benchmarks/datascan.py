"""Benchmark of ``nndoctor data``: speed against CleanVision, cached re-scans, bounded memory.

    python benchmarks/datascan.py                      # everything (≈15–25 min on 2 cores)
    python benchmarks/datascan.py --images 2000 --rss-files 20000 --skip-cleanvision

1. Generates a photo-like dataset: N JPEGs (smooth gradients, shapes, texture, noise),
   96–512 px per side, 10 classes, train/ and val/ (80/20), with a few realistic defects
   CleanVision can also see (grayscale images, exact duplicates, resized copies of train
   images in val, blank images).
2. Times, end to end as separate processes on the same machine in the same run:
   ``nndoctor data ROOT --no-cache``, ``nndoctor data ROOT`` (cold cache), the same again
   (warm cache), the re-scan after adding files, and CleanVision's ``Imagelab(data_path=ROOT)
   .find_issues()`` with its default issue types and default worker count.
3. Generates a tree of small images (default 200,000) and records the peak RSS of the whole
   ``nndoctor data`` process tree (main + workers, sampled from /proc), at 1/10 and full size.
Generated trees are deleted at the end unless --keep is given.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CLASSES = [f"class_{i:02d}" for i in range(10)]


# -- generation ----------------------------------------------------------------------------
def photo_like(seed: int, width: int, height: int) -> Image.Image:
    """Smooth lighting, overlapping shapes, blur, texture and sensor noise: JPEG-compressible
    like a photo, and different enough per seed that unrelated images never hash alike."""
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.empty((height, width, 3), np.float32)
    for c in range(3):
        angle, scale = rng.uniform(0, 6.28), rng.uniform(0.3, 1.5)
        ramp = np.cos(angle) * x / width + np.sin(angle) * y / height
        base[..., c] = rng.uniform(40, 200) + 60 * scale * ramp
    image = Image.fromarray(base.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(4, 12)):
        color = tuple(rng.randint(0, 255) for _ in range(3))
        x0, y0 = rng.uniform(-0.2, 1.0) * width, rng.uniform(-0.2, 1.0) * height
        x1, y1 = x0 + rng.uniform(0.1, 0.7) * width, y0 + rng.uniform(0.1, 0.7) * height
        shape = rng.random()
        if shape < 0.4:
            draw.ellipse((x0, y0, x1, y1), fill=color)
        elif shape < 0.7:
            draw.rectangle((x0, y0, x1, y1), fill=color)
        else:
            points = [(rng.uniform(0, width), rng.uniform(0, height)) for _ in range(rng.randint(3, 6))]
            draw.polygon(points, fill=color)
    image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 2.5)))
    noisy = np.asarray(image, np.float32) + nprng.normal(0, rng.uniform(2, 8), (height, width, 3))
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8))


def _write_one(job: tuple[str, int, int, int, int]) -> None:
    path, seed, width, height, quality = job
    photo_like(seed, width, height).save(path, "JPEG", quality=quality)


def generate_dataset(root: Path, count: int, workers: int) -> dict:
    rng = random.Random(0)
    jobs = []
    for i in range(count):
        split = "train" if i % 5 else "val"
        cls = CLASSES[(i // 5) % len(CLASSES)]
        folder = root / split / cls
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append((str(folder / f"{i:06d}.jpg"), i, rng.randint(96, 512), rng.randint(96, 512), rng.randint(75, 95)))
    with multiprocessing.Pool(workers) as pool:
        pool.map(_write_one, jobs, chunksize=64)
    train = [j for j in jobs if "/train/" in j[0]]
    injected = {"grayscale": [], "exact_duplicates": [], "val_leaks": [], "blank": []}
    for path, *_ in train[:30]:
        Image.open(path).convert("L").save(path, "JPEG", quality=90)
        injected["grayscale"].append(path)
    for path, *_ in train[30:40]:
        copy = path.replace(".jpg", "_copy.jpg")
        shutil.copyfile(path, copy)
        injected["exact_duplicates"].append(copy)
    for k, (path, *_) in enumerate(train[40:50]):
        image = Image.open(path)
        leak = root / "val" / CLASSES[k] / f"leak_{k}.jpg"
        image.resize((image.width * 3 // 4, image.height * 3 // 4)).save(leak, "JPEG", quality=80)
        injected["val_leaks"].append(str(leak))
    for k in range(5):
        blank = root / "train" / CLASSES[k] / f"blank_{k}.jpg"
        Image.new("RGB", (320, 240), (0, 0, 0)).save(blank)
        injected["blank"].append(str(blank))
    return injected


def _write_small(job: tuple[str, int]) -> None:
    path, seed = job
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(path, "PNG")


def generate_small_tree(root: Path, count: int, workers: int, per_folder: int = 1000) -> None:
    jobs = []
    for i in range(count):
        folder = root / f"class_{i // per_folder:04d}"
        if i % per_folder == 0:
            folder.mkdir(parents=True, exist_ok=True)
        jobs.append((str(folder / f"{i:07d}.png"), i))
    with multiprocessing.Pool(workers) as pool:
        pool.map(_write_small, jobs, chunksize=512)


# -- measuring -----------------------------------------------------------------------------
def _tree_rss_kib(pid: int) -> int:
    """Resident memory of a process and all its descendants, from /proc (KiB)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
            except OSError:
                continue
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
        stack.extend(children.get(current, []))
    return total


def timed(command: list[str], env: dict[str, str], sample_rss: bool = False) -> dict:
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    if sample_rss:
        while process.poll() is None:
            peak = max(peak, _tree_rss_kib(process.pid))
            time.sleep(0.1)
    stdout, stderr = process.communicate()
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "rc": process.returncode, "peak_tree_rss_mib": round(peak / 1024, 1),
            "stdout_tail": stdout[-3000:], "stderr_tail": stderr[-3000:]}


CLEANVISION_SCRIPT = """
import sys
from cleanvision import Imagelab
lab = Imagelab(data_path=sys.argv[1])
lab.find_issues()
print(lab.issue_summary.to_string())
"""


def nndoctor_command(*args: str) -> list[str]:
    # nndoctor.commands.data runs the same subcommand without importing the others.
    return [sys.executable, "-m", "nndoctor.commands.data", *args]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--rss-files", type=int, default=200_000)
    parser.add_argument("--workdir", default=None, help="where to generate (default: a temp folder)")
    parser.add_argument("--skip-cleanvision", action="store_true")
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the generated trees")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse WORKDIR/photos from an earlier --keep run instead of generating it")
    parser.add_argument("--out", default="benchmarks/_out/datascan.json")
    args = parser.parse_args()
    workers = os.cpu_count() or 1
    work = Path(args.workdir or tempfile.mkdtemp(prefix="nndoctor-bench-"))
    cache = work / "cache"
    env = {**os.environ, "NNDOCTOR_CACHE_DIR": str(cache)}
    results: dict = {"machine": {"cpus": workers, "python": sys.version.split()[0]}, "images": args.images}
    try:
        root = work / "photos"
        shutil.rmtree(cache, ignore_errors=True)
        started = time.perf_counter()
        if not (args.reuse and root.exists()):
            results["injected"] = {k: len(v) for k, v in generate_dataset(root, args.images, workers).items()}
        results["generate_seconds"] = round(time.perf_counter() - started, 1)
        files = sum(len(f) for _, _, f in os.walk(root))
        results["files"] = files
        print(f"generated {files} files in {results['generate_seconds']} s", flush=True)

        report = work / "report.json"
        runs = {
            "nndoctor_no_cache": nndoctor_command(str(root), "--no-cache", "--json", str(report)),
            "nndoctor_cold_cache": nndoctor_command(str(root)),
            "nndoctor_warm_cache": nndoctor_command(str(root)),
        }
        for name, command in runs.items():
            results[name] = timed(command, env)
            print(name, results[name]["seconds"], "s", flush=True)
        data = json.loads(report.read_text())
        results["nndoctor_findings"] = {f["code"]: f["evidence"].get("count", f["count"]) for f in data["findings"]}
        results["nndoctor_scan_stats"] = data["extra"]["scan"]

        # Add 1% new files (with two truncated JPEGs among them) and re-scan with the cache.
        new = root / "train" / CLASSES[0]
        for k in range(files // 100):
            _write_one((str(new / f"new_{k}.jpg"), 10_000_000 + k, 256, 256, 90))
        for k in range(2):
            cut = new / f"new_{k}.jpg"
            cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
        results["added_files"] = files // 100
        results["nndoctor_rescan_after_adding"] = timed(nndoctor_command(str(root), "--json", str(report)), env)
        rescan = json.loads(report.read_text())
        results["rescan_stats"] = rescan["extra"]["scan"]
        results["rescan_found_truncated"] = [f["evidence"]["files"] for f in rescan["findings"] if f["code"] == "F101"]
        print("rescan", results["nndoctor_rescan_after_adding"]["seconds"], "s", flush=True)
        for k in range(files // 100):  # back to the state that was timed, which CleanVision can read
            (new / f"new_{k}.jpg").unlink()

        if not args.skip_cleanvision:
            command = [sys.executable, "-c", CLEANVISION_SCRIPT, str(root)]
            results["cleanvision"] = timed(command, env)
            print("cleanvision", results["cleanvision"]["seconds"], "s", flush=True)
            crash_dir = work / "cv_crash"
            crash_dir.mkdir()
            sample = next((root / "train" / CLASSES[1]).iterdir())
            shutil.copy(sample, crash_dir / "ok.jpg")
            (crash_dir / "cut.jpg").write_bytes(sample.read_bytes()[: sample.stat().st_size // 2])
            crash = timed([sys.executable, "-c", CLEANVISION_SCRIPT, str(crash_dir)], env)
            results["cleanvision_on_truncated_jpeg"] = {"rc": crash["rc"], "error": crash["stderr_tail"].strip().splitlines()[-1:]}
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

        if not args.skip_rss:
            for count in (args.rss_files // 10, args.rss_files):
                tree = work / f"small_{count}"
                started = time.perf_counter()
                generate_small_tree(tree, count, workers)
                generated = round(time.perf_counter() - started, 1)
                run = timed(nndoctor_command(str(tree), "--no-cache", "--ignore", "F108"), env, sample_rss=True)
                results[f"rss_{count}"] = {"generate_seconds": generated, **run}
                print(f"rss {count}: {run['peak_tree_rss_mib']} MiB, {run['seconds']} s", flush=True)
                shutil.rmtree(tree, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for value in results.values():
        if isinstance(value, dict):
            value.pop("stdout_tail", None) if value.get("rc") == 0 else None
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
