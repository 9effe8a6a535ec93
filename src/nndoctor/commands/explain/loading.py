"""Explanations of data-loading crashes: E114 crop larger than the image, E115 worker died,
E116 CUDA in a forked worker, E122 unpicklable worker object."""

from __future__ import annotations

import re
import shutil
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation
from nndoctor.commands.explain.crash import Crash
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register


def _failing_samples(crash: Crash, evidence: dict[str, Any]) -> str:
    """Re-fetch the failing batch (live) and name the samples that raise; '' when unknown."""
    from nndoctor.commands.explain.samples import (
        batch_indices,
        describe_probe,
        find_dataset,
        probe_items,
    )

    indices = batch_indices(crash)
    if not indices:
        return ""
    evidence["batch_indices"] = indices[:32]
    dataset = find_dataset(crash) if crash.is_live else None
    if dataset is None:
        return f" The failing batch holds dataset indices {indices[:16]}."
    probes = probe_items(dataset, indices)
    failing = [p for p in probes if p.error]
    if not failing:
        return f" The failing batch holds dataset indices {indices[:16]} (none fails when re-fetched alone: a random transform?)."
    evidence["failing_samples"] = [describe_probe(p) for p in failing[:10]]
    paths = [p.path for p in failing if p.path]
    if paths:
        evidence["files"] = paths[:10]
    listed = "; ".join(f"index {p.index}" + (f" ({p.path})" if p.path else "") for p in failing[:5])
    return f" Re-fetched one by one, {len(failing)} of the batch's {len(probes)} samples fail: {listed}."


@register
class CropLargerThanImage(CrashExplanation):
    """
    ## What it does
    Explains "Required crop size (224, 224) is larger than input image size (200, 200)" and
    the older "empty range for randrange() (0, -23, -23)" from ``RandomCrop``: names the crop
    and image sizes and, on a live run, the samples (index, file) that are too small.

    ## Why is this bad?
    ``RandomCrop(224)`` needs every image to be at least 224×224. Writing
    ``RandomCrop(224)`` where ``RandomResizedCrop(224)`` was meant crashes in the loader —
    only when a small image came up.

    ## Example
    ```python
    transforms.RandomCrop(224)
    ```

    ## Use instead
    ```python
    transforms.RandomResizedCrop(224)                  # or
    transforms.Compose([transforms.Resize(256), transforms.RandomCrop(224)])
    transforms.RandomCrop(224, pad_if_needed=True)
    ```

    ## References
    - torchvision docs, ``RandomCrop(pad_if_needed=...)``, ``RandomResizedCrop``.
    """

    code = "E114"
    name = "crop-larger-than-image"
    summary = "a crop transform asked for a crop larger than the image"
    fix = "resize before cropping (Resize(256) then RandomCrop(224)), use RandomResizedCrop, or pad_if_needed=True"
    patterns = (
        r"Required crop size \((?P<ch>\d+), (?P<cw>\d+)\) is larger than input image size \((?P<ih>\d+), (?P<iw>\d+)\)",
        r"empty range for randrange\(\) \((?P<a>-?\d+),\s*(?P<b>-?\d+),\s*(?P<c>-?\d+)\)",
        r"empty range in randrange\((?P<a2>-?\d+), (?P<b2>-?\d+)\)",
    )
    order = 30

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        facts = super().match(crash)
        if facts is None:
            return None
        if "ch" in facts:
            return facts
        # randrange's empty range is a crop only when a transform is on the stack.
        transform_frames = any("transforms" in f.path for f in crash.frames + crash.worker_frames)
        return facts if transform_frames or "crop" in crash.text.lower() else None

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {}
        if "ch" in facts:
            crop, image = (int(facts["ch"]), int(facts["cw"])), (int(facts["ih"]), int(facts["iw"]))
            evidence.update({"crop": list(crop), "image": list(image)})
            message = f"A crop of {crop[0]}×{crop[1]} was requested from an image of {image[0]}×{image[1]}."
        else:
            message = ("A random crop had no valid position: randrange got an empty range "
                       f"({facts.get('a', facts.get('a2'))}, {facts.get('b', facts.get('b2'))}), i.e. the image "
                       "is smaller than the crop.")
        message += _failing_samples(crash, evidence)
        return cls.make(crash, message, evidence=evidence)


def shared_memory_mib() -> float | None:
    """Size of /dev/shm in MiB (where worker batches travel), None where there is none."""
    try:
        return shutil.disk_usage("/dev/shm").total / 2**20
    except OSError:
        return None


@register
class DataloaderWorkerDied(CrashExplanation):
    """
    ## What it does
    Explains "DataLoader worker (pid 1234) is killed by signal: Bus error" / "…exited
    unexpectedly" / "killed by signal: Killed": says what the signal means (shared memory
    exhausted, host RAM exhausted, a crash in native code) and shows the size of
    ``/dev/shm``.

    ## Why is this bad?
    Workers pass batches through shared memory; Docker's default ``/dev/shm`` is 64 MB, so
    image batches exhaust it (Bus error). "Killed" is the kernel's OOM killer: each worker
    holds its own copy of a dataset that keeps Python lists of samples.

    ## Example
    ```python
    DataLoader(ds, batch_size=256, num_workers=16)     # in a container with 64 MB /dev/shm
    ```

    ## Use instead
    ```sh
    docker run --shm-size=8g ...      # or --ipc=host
    ```
    Or fewer workers / smaller batches; keep sample lists as numpy arrays, not Python lists.

    ## References
    - PyTorch docs, "Multi-process data loading" and the note on shared memory in Docker.
    """

    code = "E115"
    name = "dataloader-worker-died"
    summary = "a DataLoader worker process died (shared memory or RAM exhausted, or a native crash)"
    fix = "raise the shared memory limit (docker --shm-size=8g or --ipc=host), or use fewer workers / smaller batches"
    patterns = (
        r"DataLoader worker \(pid[^)]*\) is killed by signal: (?P<signal>[\w ]+)",
        r"DataLoader worker \(pid\(s\) [^)]*\) exited unexpectedly",
        r"unable to write to file </torch_\w+>|No space left on device.*shm",
        # The worker's own SIGBUS handler (torch/csrc/DataLoader.cpp) prints this before it dies.
        r"Unexpected (?P<signal>bus error) encountered in worker",
    )
    # That handler's line, often glued to a progress bar, is all some logs keep of the crash.
    log_lines = (r"ERROR: Unexpected bus error encountered in worker\. This might be caused by insufficient shared memory",
                 r"DataLoader worker \(pid[^)]*\) is killed by signal: ")
    order = 20

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        signal = (facts.get("signal") or "").strip()
        evidence: dict[str, Any] = {"signal": signal} if signal else {}
        shm = shared_memory_mib() if crash.is_live else None
        if shm is not None:
            evidence["dev_shm_mib"] = round(shm)
        fix = cls.fix
        if signal.lower().startswith("bus") or "shm" in crash.text or "torch_" in crash.text:
            message = "A DataLoader worker ran out of shared memory (/dev/shm) passing a batch to the main process."
        elif signal.lower().startswith("killed"):
            message = ("A DataLoader worker was killed by the operating system, almost always the out-of-memory "
                       "killer: the workers together used more RAM than the machine has.")
            fix = ("use fewer workers or smaller batches; store dataset sample lists as numpy arrays "
                   "(Python lists are copied into every worker as they are touched)")
        elif signal.lower().startswith("segmentation"):
            message = "A DataLoader worker crashed in native code (segmentation fault), e.g. in an image decoder or OpenCV."
            fix = "run with num_workers=0 to get the real error; cv2.setNumThreads(0) when OpenCV is used in workers"
        else:
            message = "A DataLoader worker process died without a Python error."
            fix = "run with num_workers=0 to see the underlying error; " + cls.fix
        if shm is not None and shm < 1024:
            message += f" /dev/shm here is only {shm:.0f} MiB."
        return cls.make(crash, message, fix=fix, evidence=evidence)


@register
class CudaInForkedWorker(CrashExplanation):
    """
    ## What it does
    Explains "Cannot re-initialize CUDA in forked subprocess": a DataLoader worker (forked
    from a process that already uses CUDA) touched CUDA — usually ``.cuda()`` /
    ``.to("cuda")`` in ``Dataset.__getitem__`` or a collate_fn.

    ## Why is this bad?
    CUDA cannot be used in a child created by ``fork`` after the parent initialised it. Data
    should reach the GPU in the main process, where it can also overlap with compute
    (``pin_memory=True`` + ``non_blocking=True``).

    ## Example
    ```python
    def __getitem__(self, i):
        return self.images[i].cuda()
    ```

    ## Use instead
    ```python
    def __getitem__(self, i):
        return self.images[i]                      # CPU tensor
    for x, y in loader:
        x = x.to(device, non_blocking=True)        # main process
    ```

    ## References
    - PyTorch docs, "CUDA in multiprocessing"; recorded message
      tests/fixtures/crash/recorded/E116_cuda_in_forked_worker.txt.
    """

    code = "E116"
    name = "cuda-in-forked-worker"
    summary = "a forked DataLoader worker tried to use CUDA"
    fix = ("return CPU tensors from the Dataset and move batches to the GPU in the training loop; "
           "or DataLoader(multiprocessing_context='spawn')")
    patterns = (r"Cannot re-initialize CUDA in forked subprocess",)
    order = 20

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {}
        user = [f for f in crash.worker_frames if f.is_user]
        message = "CUDA was used inside a forked DataLoader worker"
        if user:
            evidence["worker_line"] = f"{user[-1].path}:{user[-1].line}: {user[-1].source}"
            message += f" by `{user[-1].source}` in {user[-1].function}()"
        message += "; a forked child cannot initialise CUDA once the parent has."
        return cls.make(crash, message, evidence=evidence)


@register
class UnpicklableWorkerObject(CrashExplanation):
    """
    ## What it does
    Explains "Can't pickle local object 'main.<locals>.<lambda>'" (and "cannot pickle
    '_io.TextIOWrapper' object", "attribute lookup <lambda> on __main__ failed") raised when
    DataLoader workers start with the ``spawn`` method (the default on macOS and Windows):
    names the object and the start method.

    ## Why is this bad?
    With ``spawn`` the dataset, its transforms, the collate_fn and worker_init_fn are
    pickled to each worker. Lambdas, functions defined inside functions, open files, database
    handles and generators cannot be pickled.

    ## Example
    ```python
    ds = MyDataset(transform=lambda img: img / 255)
    DataLoader(ds, num_workers=4)              # on macOS/Windows
    ```

    ## Use instead
    ```python
    def scale(img): return img / 255           # module level
    # open files lazily inside __getitem__ / worker_init_fn
    ```

    ## References
    - PyTorch docs, "Platform-specific behaviors" of multi-process data loading.
    - Python docs, "What can be pickled and unpickled?".
    """

    code = "E122"
    name = "unpicklable-worker-object"
    summary = "the dataset/collate_fn holds an object that cannot be pickled for spawned workers"
    fix = "define transforms and functions at module level (no lambdas/local functions); open files inside __getitem__"
    patterns = (
        r"Can't (?:pickle|get) local object '(?P<local>[^']+)'",
        r"Can't pickle (?P<object><[^>]+>): attribute lookup (?P<attr>\S+) on (?P<module>\S+) failed",
        r"cannot pickle '(?P<kind>[^']+)' object",
    )
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {k: v for k, v in facts.items()}
        what = facts.get("local") or facts.get("object") or facts.get("kind") or "an object"
        in_loader = any("dataloader" in f.path or "multiprocessing" in f.path for f in crash.frames)
        message = f"`{what}` cannot be pickled"
        if in_loader:
            method = _start_method(crash)
            if method:
                evidence["start_method"] = method
            message += (", and DataLoader workers started with "
                        f"'{method or 'spawn'}' receive the dataset, transforms and collate_fn by pickling")
        message += "."
        if re.search(r"<lambda>|<locals>", what):
            message += " Lambdas and functions defined inside other functions cannot be pickled."
        elif facts.get("kind"):
            message += f" A {facts['kind']} (an open file, lock or handle) cannot travel to another process."
        return cls.make(crash, message, evidence=evidence)


def _start_method(crash: Crash) -> str | None:
    if not crash.is_live:
        return None
    for frame in reversed(crash.live_frames()):
        owner = frame.f_locals.get("self")
        context = frame.f_locals.get("multiprocessing_context") or getattr(owner, "multiprocessing_context", None)
        if context is not None and hasattr(context, "get_start_method"):
            try:
                return context.get_start_method()
            except Exception:  # noqa: BLE001
                return None
    try:
        import multiprocessing

        return multiprocessing.get_start_method(allow_none=True)
    except Exception:  # noqa: BLE001
        return None
