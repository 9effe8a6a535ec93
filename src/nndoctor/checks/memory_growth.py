"""P111 memory growth: allocated memory rising step over step, with its holder when visible.

Measured on sampled optimizer steps only. On CUDA the allocator's counter is read
(``torch.cuda.memory_allocated``: a host-side number, no synchronisation). On CPU, where
torch keeps no allocator statistics, the bytes malloc has in use are read (glibc
``mallinfo2``, microseconds; the resident memory elsewhere); only when they grow steadily are live tensors counted —
one pass over the garbage collector's objects on two sampled steps — to confirm that
tensors hold the growth and to name the list/dict that keeps them.
"""

from __future__ import annotations

import ctypes
import gc
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from nndoctor.core.events import StepEnd
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import sampled_only

_MB = 2**20


@dataclass
class MemorySample:
    step: int
    bytes: int
    graph_tensors: int = 0  # live tensors that carry an autograd graph (CPU scan only)
    containers: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (tensors, with graph)


def scan_live_tensors(min_container: int = 4) -> MemorySample:
    """Bytes of the distinct storages of every live CPU tensor, the number of live tensors
    with an autograd graph, and the lists/dicts/tuples holding ≥ ``min_container`` tensors."""
    storages: dict[int, int] = {}
    graph_tensors = 0
    containers: dict[int, tuple[int, int]] = {}
    tensor_type = torch.Tensor
    for obj in gc.get_objects():
        cls = type(obj)  # not isinstance: some objects' __class__ properties warn when read
        if cls is tensor_type or cls is torch.nn.Parameter or (cls not in (list, dict) and issubclass(cls, tensor_type)):
            if obj.device.type != "cpu" or obj.is_sparse or obj.is_meta:
                continue
            try:
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, NotImplementedError):
                continue
            if obj.grad_fn is not None:
                graph_tensors += 1
        elif (cls is list or cls is dict) and len(obj) >= min_container:
            values = list(obj.values()) if cls is dict else obj
            # Most large dicts and lists hold no tensors: look at both ends before counting.
            if not (issubclass(type(values[0]), tensor_type) and issubclass(type(values[-1]), tensor_type)):
                continue
            tensors = with_graph = 0
            for value in values:
                if issubclass(type(value), tensor_type):
                    tensors += 1
                    with_graph += value.grad_fn is not None
            if tensors >= min_container:
                containers[id(obj)] = (tensors, with_graph)
    return MemorySample(step=0, bytes=sum(storages.values()), graph_tensors=graph_tensors, containers=containers)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


def _load_mallinfo2() -> Any:
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        return None
    function.restype = _MallInfo2
    return function


_MALLINFO2 = _load_mallinfo2() if sys.platform.startswith("linux") else None


def heap_in_use_bytes() -> int | None:
    """Bytes malloc has handed out and not taken back (glibc ``mallinfo2``: ``uordblks`` +
    ``hblkhd``), where torch's CPU tensors live. Unlike the resident memory it grows when new
    tensors reuse heap that earlier work freed (resident memory then stays flat, and a growth
    went unseen when the process had freed memory before). The resident memory where glibc's
    counters are missing."""
    if _MALLINFO2 is None:
        return resident_bytes()
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


def resident_bytes() -> int | None:
    """The process's resident memory (Linux ``/proc/self/statm``), None elsewhere."""
    import os

    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def growth_verdict(samples: list[MemorySample], *, min_samples: int = 6, min_mb_per_step: float = 0.5,
                   min_relative: float = 0.05, monotone: float = 0.8) -> float | None:
    """Least-squares growth in bytes per step when memory rises steadily: at least
    ``min_samples`` samples, rising (or flat) in ≥ ``monotone`` of the intervals, by
    ≥ ``min_mb_per_step`` MB per step and ≥ ``min_relative`` of the first sample overall."""
    if len(samples) < min_samples:
        return None
    steps = [s.step for s in samples]
    values = [s.bytes for s in samples]
    n = len(samples)
    mean_step, mean_value = sum(steps) / n, sum(values) / n
    denominator = sum((x - mean_step) ** 2 for x in steps)
    if denominator <= 0:
        return None
    slope = sum((x - mean_step) * (y - mean_value) for x, y in zip(steps, values)) / denominator
    rises = sum(1 for a, b in zip(values, values[1:]) if b >= a)
    if rises < monotone * (n - 1):
        return None
    if slope < min_mb_per_step * _MB or values[-1] - values[0] < min_relative * max(values[0], 1):
        return None
    return slope


def growing_containers(samples: list[MemorySample]) -> list[tuple[int, int, int, int]]:
    """(id, tensors at first sight, tensors now, of which with graph) of the containers that
    grew in every sample where they were seen, largest growth first."""
    first: dict[int, int] = {}
    last: dict[int, tuple[int, int]] = {}
    steady: dict[int, bool] = {}
    for sample in samples:
        for key, (count, with_graph) in sample.containers.items():
            if key in last and count <= last[key][0]:
                steady[key] = False
            first.setdefault(key, count)
            steady.setdefault(key, True)
            last[key] = (count, with_graph)
    latest = samples[-1].containers if samples else {}
    grown = [(key, first[key], last[key][0], last[key][1]) for key in last
             if key in latest and steady[key] and last[key][0] > first[key]]
    return sorted(grown, key=lambda g: g[1] - g[2])


def available_bytes(device: torch.device) -> int | None:
    """Memory still free for the process on ``device``."""
    if device.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(device)
            return int(free)
        except RuntimeError:
            return None
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _find_name(frame: Any, target_id: int) -> str | None:
    """The variable of the user's frame (a local, a global, or an attribute of one) that
    holds the container with id ``target_id``."""
    local_vars = frame.f_locals
    function_frame = local_vars is not frame.f_globals
    try:
        for namespace in (local_vars, frame.f_globals) if function_frame else (local_vars,):
            for name, value in list(namespace.items()):
                if id(value) == target_id:
                    return name
                attributes = getattr(value, "__dict__", None)
                if isinstance(attributes, dict) and not isinstance(value, type):
                    for attribute, inner in list(attributes.items()):
                        if id(inner) == target_id:
                            return f"{name}.{attribute}"
        return None
    finally:
        if function_frame and sys.version_info < (3, 13):
            # Before 3.13 f_locals of a function frame is a snapshot stored on the frame:
            # empty it so no local of the user's stays alive through us (as P108 does).
            local_vars.clear()
        del local_vars


def append_line(frame: Any, name: str) -> int | None:
    """The line that adds to ``name`` (``name.append(``, ``name[k] =``, ``name +=``, …) in
    the source file of ``frame``."""
    import linecache

    lines = linecache.getlines(frame.f_code.co_filename, frame.f_globals)
    word = re.escape(name)
    pattern = re.compile(rf"(?<![\w.]){word}\s*(\.(append|extend|insert|update|setdefault)\(|\[.*\]\s*=[^=]|\+=)")
    for number, line in enumerate(lines, start=1):
        if pattern.search(line):
            return number
    return None


@register
class MemoryGrowth(Check):
    """
    ## What it does
    On sampled optimizer steps from step 3 on, measures memory: on CUDA the caching
    allocator's allocated bytes (a host-side counter, no synchronisation); on CPU the
    bytes malloc has in use (glibc ``mallinfo2``; the resident memory from ``/proc/self/statm``
    where it is missing — resident memory stays flat while new tensors reuse freed heap). When at least 6 samples rise
    steadily (in ≥ 80% of the intervals) by **≥ 0.5 MB per step** and ≥ 5% overall — on
    CPU, and when the bytes of the distinct storages of live tensors, counted on that
    sampled step and the next (one pass over the garbage collector's objects each), grow
    at that rate too — it reports the growth rate, the step at which the free memory would run out at that rate,
    and — when visible (two passes over the live objects, on the step that decides and
    the next sampled one) — what holds the memory: a list or dict in the user's code whose
    number of tensors grows every step (with or without autograd graphs), or a growing
    number of live tensors that carry autograd graphs.

    ## Why is this bad?
    Memory that grows every step ends in an out-of-memory error, often hours into the run
    and far from the line that causes it. The usual causes: outputs or losses kept with
    their graphs (``outputs.append(model(x))``), evaluation run with gradients enabled,
    caches keyed by something unbounded, metrics accumulated as tensors instead of Python
    numbers. Memory use that is stable after the first steps is normal (optimizer state is
    allocated at the first ``step()``); that is why sampling starts at step 3.

    ## Example
    ```python
    history = []
    for x, y in loader:
        logits = model(x)
        history.append(logits)                 # each step's graph and activations stay alive
        loss = criterion(logits, y)
    ```

    ## Use instead
    ```python
        history.append(logits.detach().cpu())  # or logits.argmax(1).tolist(), loss.item()
    ```
    Thresholds: 0.5 MB per step and 5% of the first sample; smaller leaks still fill a
    device, but only over runs far longer than the sampled window can tell apart from noise.

    ## References
    - PyTorch FAQ, "My model reports cuda runtime error(2): out of memory" (accumulating history across the training loop): https://pytorch.org/docs/stable/notes/faq.html
    - PyTorch docs, "Understanding CUDA Memory Usage" (``memory_allocated``, memory snapshots): https://pytorch.org/docs/stable/torch_cuda_memory.html
    """

    code = "P111"
    name = "memory-growth"
    severity = Severity.WARNING
    summary = "memory grows step over step, with the cause when visible"
    fix = "keep Python numbers or detached CPU copies (loss.item(), x.detach().cpu()) instead of tensors with graphs"
    FROM_STEP = 3
    MAX_SAMPLES = 64

    def __init__(self, session) -> None:
        super().__init__(session)
        self._samples: list[MemorySample] = []
        self._scans: list[MemorySample] = []  # CPU: live-tensor counts confirming a growth
        self._device: torch.device | None = None
        self._reported = False

    @sampled_only
    def on_step_end(self, event: StepEnd) -> None:
        if self._reported or not event.sampled or event.step < self.FROM_STEP:
            return
        if self._device is None:
            self._device = _parameter_device(event.optimizer)
        if self._device.type == "cuda":
            self._on_cuda_step(event)
            return
        self._on_cpu_step(event)

    def _on_cuda_step(self, event: StepEnd) -> None:
        self._samples.append(MemorySample(step=event.step, bytes=torch.cuda.memory_allocated(self._device)))
        del self._samples[:-self.MAX_SAMPLES]
        slope = growth_verdict(self._samples)
        if slope is None:
            self._scans = []
            return
        # The allocator's counter decides; two scans of the live objects (this sampled step
        # and the next) only look for the list/dict that holds the growing tensors.
        scan = scan_live_tensors()
        scan.step, scan.bytes = event.step, self._samples[-1].bytes
        self._scans.append(scan)
        if len(self._scans) < 2:
            return
        self._reported = True
        self._report(event, slope, self._samples, containers_from=self._scans)

    def _on_cpu_step(self, event: StepEnd) -> None:
        if self._scans:  # confirming: count the live tensors a second time
            scan = scan_live_tensors()
            scan.step = event.step
            self._scans.append(scan)
            slope = growth_verdict(self._scans, min_samples=2, monotone=1.0)
            if slope is not None:
                self._reported = True
                self._report(event, slope, self._scans)
            else:  # the resident memory grew, but not through tensors: start over
                self._samples, self._scans = [], []
            return
        in_use = heap_in_use_bytes()
        if in_use is None:
            return
        self._samples.append(MemorySample(step=event.step, bytes=in_use))
        del self._samples[:-self.MAX_SAMPLES]
        # The heap includes the interpreter's and the libraries' (hundreds of MB with torch):
        # no relative threshold here; the tensor count below applies it.
        if growth_verdict(self._samples, min_relative=0.0) is not None:
            scan = scan_live_tensors()
            scan.step = event.step
            self._scans = [scan]

    def _report(self, event: StepEnd, slope: float, samples: list[MemorySample],
                containers_from: list[MemorySample] | None = None) -> None:
        first, last = samples[0], samples[-1]
        device = self._device or torch.device("cpu")
        free = available_bytes(device)
        projection, evidence_extra = "", {}
        if free:
            steps_left = int(free / slope)
            projection = f"; at this rate the free {free / 2**30:.1f} GiB run out at about step {event.step + steps_left}"
            evidence_extra = {"free_bytes": free, "projected_full_step": event.step + steps_left}
        location, cause, holder = self._cause(event, containers_from or samples)
        measured = "allocated GPU memory" if device.type == "cuda" else "memory held by live tensors"
        self.report(
            f"The {measured} grows every step: {first.bytes / _MB:.1f} MB at step {first.step} → "
            f"{last.bytes / _MB:.1f} MB at step {last.step}, {slope / _MB:.2f} MB per step{projection}. {cause}",
            location=location or event.location,
            evidence={"mb_per_step": round(slope / _MB, 4), "first_step": first.step, "first_mb": round(first.bytes / _MB, 3),
                      "last_step": last.step, "last_mb": round(last.bytes / _MB, 3), "holder": holder,
                      "device": str(device), **evidence_extra},
            step=event.step,
        )

    def _cause(self, event: StepEnd, samples: list[MemorySample]) -> tuple[Location | None, str, str | None]:
        from nndoctor.core.user_code import display_path, user_frame

        grown = growing_containers(samples) if samples[-1].containers or samples[0].containers else []
        if grown:
            key, before, now, with_graph = grown[0]
            frame = user_frame(event.frame)
            name = _find_name(frame, key) if frame is not None else None
            line = append_line(frame, name) if name else None
            location = (Location(display_path(frame.f_code.co_filename), line)
                        if line is not None and frame is not None else None)
            del frame
            what = "tensors with their autograd graphs" if with_graph * 2 >= now else "tensors"
            label = f"`{name}`" if name else "a list/dict"
            return (location, f"{label} keeps growing: it held {before} {what} at step {samples[0].step} and "
                    f"{now} at step {samples[-1].step}.", name)
        if samples[-1].graph_tensors > samples[0].graph_tensors + 8:
            return (None, f"Live tensors carrying autograd graphs grew from {samples[0].graph_tensors} to "
                    f"{samples[-1].graph_tensors}: graphs are kept alive (outputs or losses kept without "
                    "detach(), or evaluation with gradients enabled).", None)
        return None, "", None


def _parameter_device(optimizer: Any) -> torch.device:
    for group in getattr(optimizer, "param_groups", []):
        for p in group["params"]:
            return p.device
    return torch.device("cpu")
