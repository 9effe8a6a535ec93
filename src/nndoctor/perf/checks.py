"""Performance checks P101–P110 (P108 retained-loss-graph lives with the memory checks).

P102 and P107 are cheap enough for ``nndoctor run`` and watch its events. The others are
``perf``-scope: ``diagnose(result)`` derives them from a finished ``PerfResult`` with the
pure functions below, each finding carrying the measured evidence and the gain that can be
expected — an Amdahl bound from the measured fractions, or the speed-up ``--try`` measured.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from nndoctor.checks._timing import share_in_halves, timing_severity
from nndoctor.findings import Finding, Location, Severity
from nndoctor.registry import Check, register

DATA_BOUND_FRACTION = 0.20  # P101/P102: catalog threshold
MIN_MEAN_WAIT_S = 0.002  # P102 under `run`: below 2 ms a batch, worker processes cost more than they save
MIN_STEPS = 5
SYNCS_PER_STEP = 1.0  # P103
SYNC_WARNING_FRACTION = 0.05
LOW_GPU_BUSY = 0.5  # P109: catalog threshold
TENSOR_CORE_CAPABILITY = (7, 0)


# -- pure detection functions -------------------------------------------------------------
def data_bound(wait_s: float, wall_s: float, *, threshold: float = DATA_BOUND_FRACTION) -> dict | None:
    """The data-wait fraction and its Amdahl bound, when the fraction passes ``threshold``."""
    if wall_s <= 0:
        return None
    fraction = wait_s / wall_s
    if fraction < threshold:
        return None
    return {"data_wait_fraction": round(fraction, 4), "data_wait_s": round(wait_s, 4),
            "wall_s": round(wall_s, 4), "max_speedup": round(1.0 / max(1e-3, 1.0 - fraction), 2)}


def loader_costs_time(num_workers: int, wait_s: float, wall_s: float, batches: int, steps: int) -> dict | None:
    """P102 under ``run``: a single-process loader whose waiting is a large, real cost."""
    if num_workers != 0 or steps < MIN_STEPS or batches == 0:
        return None
    found = data_bound(wait_s, wall_s)
    if found is None or wait_s / batches < MIN_MEAN_WAIT_S:
        return None
    return {**found, "mean_wait_ms": round(1000 * wait_s / batches, 2), "batches": batches}


def sync_overlap_bound(phases: dict[str, float], wall: float) -> float:
    """Fraction of the step a removed sync could hide: the host's own work (data, copies,
    Python) that could then run while the GPU computes, capped by the time spent blocked."""
    if wall <= 0:
        return 0.0
    host_work = phases.get("data", 0) + phases.get("h2d", 0) + phases.get("other", 0) + phases.get("io", 0)
    return min(phases.get("sync", 0.0), host_work) / wall


def frequent_syncs(syncs_per_step: float, *, threshold: float = SYNCS_PER_STEP) -> bool:
    return syncs_per_step >= threshold


def low_gpu_busy(busy_fraction: float | None, *, threshold: float = LOW_GPU_BUSY) -> bool:
    return busy_fraction is not None and busy_fraction < threshold


def fp32_on_tensor_cores(device: str, capability: tuple[int, int] | None, param_dtype: str, autocast: bool) -> bool:
    return (device == "cuda" and capability is not None and tuple(capability) >= TENSOR_CORE_CAPABILITY
            and param_dtype == "float32" and not autocast)


def nchw_conv_on_gpu(device: str, has_conv: bool, channels_last: bool | None) -> bool:
    return device == "cuda" and has_conv and channels_last is False


def fixed_shapes_without_benchmark(device: str, has_conv: bool, shapes: set, benchmark: bool) -> bool:
    return device == "cuda" and has_conv and len(shapes) == 1 and not benchmark


def dataparallel_severity(device_ids: list | None) -> Severity:
    """Over several GPUs DataParallel costs real time; on one (or none) it is only advice."""
    return Severity.WARNING if device_ids and len(device_ids) > 1 else Severity.INFO


def trial_outcome(trials: dict[str, Any], name: str) -> dict | None:
    """The --try measurement of ``name`` if it ran (None: not measured)."""
    result = trials.get(name)
    if not isinstance(result, dict) or "speedup" not in result:
        return None
    return result


# -- run-scope checks -----------------------------------------------------------------------
@register
class InputPipelineBound(Check):
    """
    ## What it does
    Times, over the measured window of `nndoctor perf`, how long the loop waits in
    `next(iter(loader))` and reports it when that is more than 20% of the step time, with
    the Amdahl bound on the speed-up that a loader that never makes the loop wait would give:
    `1 / (1 - fraction)`.

    ## Why is this bad?
    While the loop waits for data the GPU has nothing to do: "算力沒用滿 — feed input 的速度
    不夠快". No model-side change
    helps until the input pipeline keeps up.

    ## Example
    ```python
    loader = DataLoader(jpeg_folder, batch_size=128)        # decoding in the main process
    for images, labels in loader:                           # the GPU idles here
        ...
    ```

    ## Use instead
    ```python
    loader = DataLoader(jpeg_folder, batch_size=128, num_workers=8, pin_memory=True,
                        persistent_workers=True)
    ```
    `nndoctor perf --try loader` measures the settings on your dataset. The 20% threshold
    is the catalog's: below it even a perfect loader gains at most 1.25×. PyTorch's
    TensorBoard profiler plugin recommends worker processes from 5% of the step time in the
    DataLoader; nndoctor reports only what is worth a change on its own (≥ 1.25×) and
    leaves smaller waits to `--try loader`, which measures them.

    ## References
    - PyTorch performance tuning guide, "Enable async data loading and augmentation": https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    - Holistic Trace Analysis, temporal breakdown: https://hta.readthedocs.io/
    - PyTorch Profiler TensorBoard plugin, its DataLoader recommendation (> 5% of the step): https://github.com/pytorch/kineto/blob/main/tb_plugin/torch_tb_profiler/profiler/run.py
    """

    code = "P101"
    name = "input-pipeline-bound"
    severity = Severity.WARNING
    summary = "the loop waits on data for >20% of step time"
    fix = "load batches in worker processes (num_workers>0, pin_memory=True); measure with --try loader"
    scope = "perf"
    heuristic = True


@register
class LoaderConfig(Check):
    """
    ## What it does
    Under `nndoctor run`: a `DataLoader(num_workers=0)` whose batches the loop waits for
    during more than 20% of the step time, and at least 2 ms a batch (over at least 5
    steps). It is a warning only when the share is reproducible: at least 30% (1.5× the
    threshold) overall and above 20% in each half of the run; a share past 20% without
    that margin (it may not be there in the next run) is reported as info. Under `nndoctor perf --try loader`: the loader's settings measured against
    `num_workers` 0, 2, 4, … up to the cores, `pin_memory`, and `prefetch_factor`; the best
    few, and the current setting, are then timed end to end (loading, the copy to the device,
    `non_blocking` when pinned, and the training step on a copy of the model), and the
    fastest is reported when it trains at least 1.2× faster than the current setting.

    ## Why is this bad?
    With `num_workers=0` every batch is read, decoded and collated in the training process,
    between two steps, while the GPU waits. The 2 ms floor keeps tiny in-memory
    datasets quiet: there, worker processes cost more than they save.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=64, shuffle=True)
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4,
                        pin_memory=torch.cuda.is_available(), persistent_workers=True)
    ```

    ## References
    - PyTorch `torch.utils.data` docs, "Single- and Multi-process Data Loading", "Memory Pinning": https://pytorch.org/docs/stable/data.html
    - PyTorch performance tuning guide: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    """

    code = "P102"
    name = "loader-config"
    severity = Severity.WARNING
    summary = "num_workers=0, pin_memory off with CUDA, etc., where it costs time"
    fix = ("DataLoader(..., num_workers=N, pin_memory=True on CUDA, persistent_workers=True); "
           "nndoctor perf --try loader measures the best N")
    heuristic = True

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        # Numbers only, kept by id: a loader built inline (``for x in DataLoader(...)``) is
        # gone by the end of the run, its measurements must not go with it.
        self._loaders: dict[int, dict[str, Any]] = {}
        self._latest: int | None = None
        self._first_step_end: float | None = None
        self._last_step_end: float | None = None
        self._steps = 0

    def on_epoch_start(self, event: Any) -> None:
        info = self._loaders.get(id(event.loader))
        if info is None or info["ref"]() is not event.loader:
            self._loaders[id(event.loader)] = {
                "ref": weakref.ref(event.loader), "location": event.location, "wait": 0.0, "batches": 0,
                "num_workers": int(getattr(event.loader, "num_workers", 0) or 0)}
        self._latest = id(event.loader)

    def on_batch(self, event: Any) -> None:
        if event.loader is None:  # a loader built inline is freed once iterated: the latest one
            info = self._loaders.get(self._latest) if self._latest is not None else None
            if info is not None and info["ref"]() is not None:
                info = None
        else:
            info = self._loaders.get(id(event.loader))
            if info is not None and info["ref"]() is not event.loader:
                info = None
        if info is not None and self._first_step_end is not None:
            info["wait"] += event.wait_s
            info["batches"] += 1
            info.setdefault("waits", []).append((time.perf_counter(), event.wait_s))

    def on_step_end(self, event: Any) -> None:
        now = time.perf_counter()
        if self._first_step_end is None:
            self._first_step_end = now
        else:
            self._steps += 1
        self._last_step_end = now

    def on_run_end(self, event: Any) -> None:
        if self._first_step_end is None or self._last_step_end is None:
            return
        wall = self._last_step_end - self._first_step_end
        for info in list(self._loaders.values()):
            found = loader_costs_time(info["num_workers"], info["wait"], wall, info["batches"], self._steps)
            if found is None:
                continue
            halves = share_in_halves(info.get("waits", []), self._first_step_end, self._last_step_end)
            severity = timing_severity(found["data_wait_fraction"], halves, DATA_BOUND_FRACTION)
            found["halves"] = [round(h, 4) for h in halves] if halves else None
            borderline = ("" if severity == Severity.WARNING else
                          f" Reported as info: the share is not clear of the {DATA_BOUND_FRACTION:.0%} threshold "
                          f"in both halves of the run ({', '.join(f'{h:.0%}' for h in halves or ())}), so "
                          "another run may measure less; nndoctor perf --try loader measures it.")
            self.report(
                f"the loop waited for this DataLoader(num_workers=0) during "
                f"{found['data_wait_fraction']:.0%} of the step time ({found['mean_wait_ms']:.1f} ms a "
                f"batch over {found['batches']} batches): loading in worker processes while the model "
                f"trains could make steps up to {found['max_speedup']:.2f}× faster (Amdahl bound).{borderline}",
                location=info["location"], evidence=found, severity=severity, step=event.step,
            )


@register
class DataParallelInUse(Check):
    """
    ## What it does
    Reports a training forward through `torch.nn.DataParallel`.

    ## Why is this bad?
    DataParallel runs one Python process that scatters the batch, replicates the model onto
    every GPU on every forward, and gathers the outputs on the first GPU: the GIL and the
    copies make it slower than `DistributedDataParallel`, and for small models slower than a
    single GPU. It also prefixes the state_dict
    keys with `module.` (C101). Severity: warning over several GPUs, info over one or none.

    ## Example
    ```python
    model = nn.DataParallel(model).cuda()
    ```

    ## Use instead
    ```python
    # torchrun --nproc_per_node=4 train.py
    torch.distributed.init_process_group("nccl")
    model = DistributedDataParallel(model.cuda(rank), device_ids=[rank])
    ```

    ## References
    - PyTorch docs, DataParallel ("It is recommended to use DistributedDataParallel, instead of DataParallel"): https://pytorch.org/docs/stable/generated/torch.nn.DataParallel.html
    """

    code = "P107"
    name = "dataparallel-in-use"
    severity = Severity.WARNING
    summary = "nn.DataParallel instead of DistributedDataParallel"
    fix = "use DistributedDataParallel (one process per GPU, launched with torchrun), or a single GPU"

    def on_forward(self, event: Any) -> None:
        import torch

        if event.is_loss or not isinstance(event.module, torch.nn.DataParallel):
            return
        device_ids = list(getattr(event.module, "device_ids", None) or [])
        self.report(
            f"training runs through nn.DataParallel over {len(device_ids)} device(s) {device_ids}: "
            "one process scatters, replicates the model and gathers on every step",
            location=event.location, evidence={"device_ids": device_ids},
            severity=dataparallel_severity(device_ids), step=event.step,
        )


# -- perf-scope checks (documentation + metadata; findings come from diagnose()) --------------
@register
class HostDeviceSync(Check):
    """
    ## What it does
    Counts, over the measured window, the calls that read a CUDA tensor back on the host —
    `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `.to("cpu")`, `float(t)`, `bool(t)`,
    `torch.cuda.synchronize()` — with the place in your code and the host time spent
    blocked in them. Reported at one or more per step.

    ## Why is this bad?
    The host waits until the GPU has finished everything queued before it, so it cannot
    queue the next step (or load the next batch) meanwhile; the GPU then idles while the
    host catches up. The estimated gain is the host's own work that could overlap the GPU,
    capped by the measured blocked time.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x.cuda()), y.cuda())
        ...
        running += loss.item()            # a sync every step
    ```

    ## Use instead
    ```python
        running += loss.detach()          # stays on the GPU
        if step % 100 == 0:
            print(running.item() / 100)   # one sync every 100 steps
    ```

    ## References
    - PyTorch performance tuning guide, "Avoid unnecessary CPU-GPU synchronization": https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    - `torch.cuda.set_sync_debug_mode`: https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html
    """

    code = "P103"
    name = "host-device-sync"
    severity = Severity.WARNING
    summary = "frequent host–device synchronizations per step"
    fix = "keep running metrics on the device (loss.detach()) and read them every N steps"
    scope = "perf"


@register
class GpuShared(Check):
    """
    ## What it does
    Lists, through NVML (nvidia-ml-py), the other compute processes on the GPU the run uses.

    ## Why is this bad?
    Several processes on the GPU share its compute, so everything is slower; their memory also leaves less for yours.
    No threshold: any other process is reported with its memory.

    ## Example
    ```
    $ nvidia-smi      # a forgotten notebook kernel still holds the GPU
    ```

    ## Use instead
    Stop the other process, or pick a free GPU with `CUDA_VISIBLE_DEVICES`.

    ## References
    - NVML `nvmlDeviceGetComputeRunningProcesses`: https://docs.nvidia.com/deploy/nvml-api/
    """

    code = "P104"
    name = "gpu-shared"
    severity = Severity.WARNING
    summary = "other processes use the same GPU"
    fix = "stop the other processes or choose a free GPU (CUDA_VISIBLE_DEVICES)"
    scope = "perf"


@register
class NoMixedPrecision(Check):
    """
    ## What it does
    Training in float32 without autocast on a GPU with tensor cores (compute capability
    7.0 or newer). With `--try amp` it times the step under
    `torch.autocast("cuda", dtype=torch.bfloat16)` against the baseline (interleaved
    repeats) and checks that the loss on the same batch moves less than 5%; a measured gain
    makes it a warning, no gain removes it.

    ## Why is this bad?
    Tensor cores run bf16/fp16 matrix products many times faster than fp32, and half the
    bytes move through memory; leaving them idle is usually the largest single waste in a
    convolutional or transformer step.

    ## Example
    ```python
    loss = criterion(model(x), y)
    ```

    ## Use instead
    ```python
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y)
    ```

    ## References
    - PyTorch AMP recipe: https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html
    - NVIDIA DeepLearningExamples ResNet-50 (AMP on A100: 2,470 images/s): https://github.com/NVIDIA/DeepLearningExamples
    """

    code = "P105"
    name = "no-mixed-precision"
    severity = Severity.WARNING
    summary = "fp32 training on a tensor-core GPU"
    fix = "wrap forward and loss in torch.autocast(device_type='cuda', dtype=torch.bfloat16)"
    scope = "perf"


@register
class MemoryFormat(Check):
    """
    ## What it does
    A network with convolutions trained on the GPU on NCHW (`contiguous_format`) input.
    With `--try channels_last` it times the step with model and input in
    `torch.channels_last` and reports only a measured gain.

    ## Why is this bad?
    cuDNN's tensor-core convolution kernels work in NHWC; given NCHW they transpose inputs
    and outputs around every convolution. The seed's advice ("data_format 改用 channel_first
    (cuDNN)") was for TensorFlow's NHWC default on pre-tensor-core cards; on
    current cards with mixed precision it is the other way round — which is why this check
    asks for a measurement before it advises.

    ## Example
    ```python
    model = torchvision.models.resnet50().cuda()
    out = model(images.cuda())
    ```

    ## Use instead
    ```python
    model = model.to(memory_format=torch.channels_last)
    out = model(images.cuda().to(memory_format=torch.channels_last))
    ```

    ## References
    - PyTorch channels-last tutorial: https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html
    """

    code = "P106"
    name = "memory-format"
    severity = Severity.WARNING
    summary = "conv net on GPU in NCHW where channels_last is faster"
    fix = "model.to(memory_format=torch.channels_last) and the same for the input batch"
    scope = "perf"


@register
class LowGpuUtilization(Check):
    """
    ## What it does
    Records CUDA events at the start of each measured step's first forward and after its
    optimizer step, and reports when that GPU span is under half of the step's wall time.
    The span includes gaps between kernels, so it is an upper bound on the busy time: a
    finding is conservative.

    ## Why is this bad?
    The GPU idles for the rest of the step — waiting for data, for the host to launch work,
    for syncs or I/O. The bound on the
    gain is `1 / busy fraction` if the idle time disappeared.

    ## Example
    ```python
    for x, y in loader:              # 60% of the step waiting for the loader
        train_step(x.cuda(), y.cuda())
    ```

    ## Use instead
    Fix what the breakdown shows first (P101/P102 data, P103 syncs, C105 checkpoints);
    for launch-bound small models, larger batches, `torch.compile` or CUDA graphs.

    ## References
    - Holistic Trace Analysis, idle time breakdown: https://hta.readthedocs.io/
    """

    code = "P109"
    name = "low-gpu-utilization"
    severity = Severity.WARNING
    summary = "GPU busy for under half the wall time"
    fix = "remove what the GPU waits for (see the breakdown: data, syncs, I/O); then grow the batch or compile"
    scope = "perf"


@register
class CudnnBenchmarkOff(Check):
    """
    ## What it does
    A conv network on CUDA fed one input shape for the whole measured window while
    `torch.backends.cudnn.benchmark` is False. With `--try cudnn-benchmark` the step is
    timed with it on; only a measured gain is advised.

    ## Why is this bad?
    With benchmark off cuDNN picks convolution algorithms by heuristic; with it on it times
    the candidates once per shape and keeps the fastest — free speed when shapes do not
    change (and a cost when they change every step, hence the single-shape condition).

    ## Example
    ```python
    model = resnet50().cuda()        # 224×224 crops, batch 128, every step
    ```

    ## Use instead
    ```python
    torch.backends.cudnn.benchmark = True
    ```

    ## References
    - PyTorch performance tuning guide, "Enable cuDNN auto-tuner": https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    """

    code = "P110"
    name = "cudnn-benchmark-off"
    severity = Severity.INFO
    summary = "fixed input shapes with cudnn.benchmark off"
    fix = "torch.backends.cudnn.benchmark = True (input shapes are fixed)"
    scope = "perf"


# -- diagnose: perf findings from a measured run ------------------------------------------------
def _measured_advice(cls: type[Check], trials: dict[str, Any], name: str, claim: str,
                     location: Location | None, evidence: dict[str, Any]) -> Finding | None:
    """Advice that --try can confirm: measured gain -> warning, no gain -> nothing, not tried -> info."""
    outcome = trial_outcome(trials, name)
    if outcome is None:
        tried = trials.get(name)
        if isinstance(tried, dict) and (tried.get("error") or tried.get("skipped")):
            # --try was given and could not measure: say why, never "pass --try".
            why = tried.get("error") or tried.get("skipped")
            return cls.finding(f"{claim}; --try {name.replace('_', '-')} could not measure it: {why}",
                               location=location, evidence={**evidence, "measured": False, "why": why},
                               severity=Severity.INFO)
        flag = name.replace("_", "-")
        return cls.finding(f"{claim}; not measured here — run nndoctor perf --try {flag} to time it",
                           location=location, evidence={**evidence, "measured": False}, severity=Severity.INFO)
    if not outcome.get("pays_off"):
        return None
    return cls.finding(
        f"{claim}; measured: {outcome['speedup']:.2f}× faster steps ({1000 * outcome['base_s']:.1f} → "
        f"{1000 * outcome['variant_s']:.1f} ms, timing noise {outcome['noise']:.1%}), "
        f"{_loss_words(outcome)} changed {outcome['loss_change']:.2%}",
        location=location, evidence={**evidence, "measured": True, "speedup": round(outcome["speedup"], 3),
                                     "noise": round(outcome["noise"], 4),
                                     "loss_change": outcome["loss_change"]},
        severity=Severity.WARNING,
    )


def _loss_words(outcome: dict[str, Any]) -> str:
    if outcome.get("measure") == "re-run":
        return "the loss after the measured window"
    return "loss on the same batch"


def diagnose(result: Any) -> list[Finding]:
    """Every perf-scope finding (and the measured P102) for a finished ``PerfResult``."""
    findings: list[Finding] = []
    b, facts, device, trials = result.breakdown, result.facts, result.device, result.trials
    if b.steps == 0:
        return findings
    ms = 1000 * b.median_step

    data = data_bound(b.phases["data"], b.wall)
    loader_trial = trials.get("loader") if isinstance(trials.get("loader"), dict) else None
    if data:
        message = (f"the loop waited for data during {data['data_wait_fraction']:.0%} of the step time "
                   f"({b.phases['data'] / b.steps * 1000:.1f} ms of a {ms:.1f} ms step): a loader that "
                   f"kept up would make steps up to {data['max_speedup']:.2f}× faster (Amdahl bound)")
        best = (loader_trial or {}).get("best")
        if best and (loader_trial or {}).get("speedup"):
            message += (f"; measured: {_setting(best)} {_rate(loader_trial, best)}, "
                        f"{loader_trial['speedup']:.2f}× the current setting")
        findings.append(InputPipelineBound.finding(message, location=facts.loader_location,
                                                   evidence={**data, "loader": facts.loader_config}))

    if loader_trial and loader_trial.get("best") and (loader_trial.get("speedup") or 0) >= 1.2:
        best, current = loader_trial["best"], loader_trial["current"]
        findings.append(LoaderConfig.finding(
            f"DataLoader({_setting(facts.loader_config)}) {_rate(loader_trial, current)}; measured on this "
            f"machine, {_setting(best)} {_rate(loader_trial, best)} ({loader_trial['speedup']:.2f}×"
            + (", loading, copy to the device and training step timed together)"
               if loader_trial.get("measure") == "end-to-end" else ")"),
            location=facts.loader_location,
            evidence={"current": facts.loader_config, "best": best, "speedup": round(loader_trial["speedup"], 3)},
            fix=f"DataLoader(..., {_setting(best)}, persistent_workers=True)"
                + ("; copy batches with .to(device, non_blocking=True)" if best.get("pin_memory") else ""),
        ))

    sync_types_hit = facts.device == "cuda" or facts.sync_kinds
    if sync_types_hit and frequent_syncs(b.syncs_per_step) and facts.sync_kinds:
        places = sorted(facts.sync_locations.items(), key=lambda kv: -kv[1])
        where = ", ".join(f"{loc or '?'} ×{n}" for loc, n in places[:3])
        blocked = b.fraction("sync")
        overlap = sync_overlap_bound(b.phases, b.wall)
        findings.append(HostDeviceSync.finding(
            f"{b.syncs_per_step:.1f} host-device syncs per step ({where}); the host sat blocked in them "
            f"{blocked:.0%} of the step time — removing them lets it prepare the next step meanwhile, "
            f"up to {1 / max(1e-3, 1 - overlap):.2f}× (overlap bound)",
            location=places[0][0] if places else None,
            evidence={"syncs_per_step": round(b.syncs_per_step, 2), "kinds": dict(facts.sync_kinds),
                      "blocked_fraction": round(blocked, 4), "max_speedup": round(1 / max(1e-3, 1 - overlap), 2)},
            severity=Severity.WARNING if blocked >= SYNC_WARNING_FRACTION else Severity.INFO,
        ))

    if device.other_processes:
        total = sum(p.get("used_memory_bytes") or 0 for p in device.other_processes)
        findings.append(GpuShared.finding(
            f"{len(device.other_processes)} other process(es) use {device.name} "
            f"(pids {[p['pid'] for p in device.other_processes]}, {total / 2**30:.1f} GiB): "
            "they share its compute and memory",
            evidence={"processes": device.other_processes},
        ))

    if fp32_on_tensor_cores(facts.device, device.capability, facts.param_dtype, facts.autocast):
        found = _measured_advice(NoMixedPrecision, trials, "amp",
                                 f"float32 training without autocast on {device.name} "
                                 f"(compute capability {device.capability[0]}.{device.capability[1]}, tensor cores)",
                                 facts.forward_location, {"param_dtype": facts.param_dtype})
        findings += [found] if found else []

    if nchw_conv_on_gpu(facts.device, facts.has_conv, facts.input_channels_last):
        found = _measured_advice(MemoryFormat, trials, "channels_last",
                                 "convolutions on NCHW input on the GPU",
                                 facts.forward_location, {"input_shapes": sorted(facts.input_shapes)[:3]})
        findings += [found] if found else []

    busy = b.gpu_busy_fraction
    if low_gpu_busy(busy):
        findings.append(LowGpuUtilization.finding(
            f"the GPU was busy at most {busy:.0%} of the step time (CUDA events over {b.steps} steps): "
            f"keeping it fed would make steps up to {1 / max(busy, 1e-3):.1f}× faster; the breakdown shows "
            f"where the rest goes",
            location=facts.forward_location,
            evidence={"gpu_busy_fraction": round(busy, 4), "max_speedup": round(1 / max(busy, 1e-3), 2)},
        ))

    if fixed_shapes_without_benchmark(facts.device, facts.has_conv, facts.input_shapes, facts.cudnn_benchmark):
        found = _measured_advice(CudnnBenchmarkOff, trials, "cudnn-benchmark",
                                 f"one input shape {next(iter(facts.input_shapes))} for the whole window "
                                 "with torch.backends.cudnn.benchmark off",
                                 facts.forward_location, {})
        findings += [found] if found else []

    from nndoctor.checks.tf32 import tf32_findings  # P115, its own module

    findings += tf32_findings(result)
    # A measured torch.compile gain has no catalog code: it appears in advice(), not here.
    return findings


def _setting(config: dict[str, Any]) -> str:
    parts = [f"num_workers={config.get('num_workers')}"]
    if config.get("pin_memory"):
        parts.append("pin_memory=True")
    if config.get("num_workers") and config.get("prefetch_factor") not in (None, 2):
        parts.append(f"prefetch_factor={config.get('prefetch_factor')}")
    return ", ".join(parts)


def _rate(loader_trial: dict[str, Any], result: dict[str, Any]) -> str:
    """A --try loader rate, worded by how it was measured: the loader alone or end to end."""
    if loader_trial.get("measure") == "end-to-end":
        return f"trains at {result['samples_per_s']:.0f} samples/s end to end"
    return f"loads {result['samples_per_s']:.0f} samples/s"


def advice(result: Any) -> list[dict[str, Any]]:
    """The changes worth making, measured where --try ran (machine-readable, for scripts)."""
    items: list[dict[str, Any]] = []
    trials = result.trials
    loader_trial = trials.get("loader") if isinstance(trials.get("loader"), dict) else None
    if loader_trial and loader_trial.get("best") and (loader_trial.get("speedup") or 0) >= 1.2:
        best = loader_trial["best"]
        items.append({"change": "loader", "num_workers": best["num_workers"], "pin_memory": best["pin_memory"],
                      "prefetch_factor": best.get("prefetch_factor"), "persistent_workers": bool(best["num_workers"]),
                      "measured_speedup": loader_trial["speedup"]})
    b = result.breakdown
    if b.steps and result.facts.sync_kinds and frequent_syncs(b.syncs_per_step):
        items.append({"change": "fewer-syncs", "syncs_per_step": b.syncs_per_step,
                      "locations": [str(k) for k in result.facts.sync_locations]})
    for name in ("amp", "channels_last", "cudnn-benchmark", "compile", "tf32", "fused-optimizer", "sdpa",
                 "cuda-graphs"):
        outcome = trial_outcome(trials, name)
        if outcome and outcome.get("pays_off"):
            items.append({"change": name, "measured_speedup": outcome["speedup"], "noise": outcome["noise"]})
    batch = trial_outcome(trials, "batch-size")
    if batch and batch.get("pays_off"):
        items.append(batch_size_advice(batch))
    return items + combined_advice(trials, {item["change"] for item in items})


def combined_advice(trials: dict[str, Any], advised: set[str]) -> list[dict[str, Any]]:
    """Changes that did not pay alone but paid on top of the paying ones (perf/combine.py)."""
    best = (trials.get("combined") or {}).get("best_added") or {}
    return [{"change": name, "measured_speedup": best["speedup"], "noise": best["noise"], "unit": "samples/s",
             "measured_with": best["over"], "measured_together_with": best["added"]}
            for name in best.get("added", []) if name not in advised]


def batch_size_advice(outcome: dict[str, Any]) -> dict[str, Any]:
    """The measured larger batch, with what it means for the learning rate: nndoctor times
    throughput, it does not check that training converges as well at that batch."""
    best, base = outcome["best"], outcome["sizes"][0]
    factor = best["factor"]
    return {
        "change": "batch-size", "batch_size": best["batch_size"], "from": base["batch_size"], "factor": factor,
        "measured_speedup": outcome["speedup"], "noise": outcome["noise"], "unit": "samples/s",
        "samples_per_s": best["samples_per_s"], "peak_memory_bytes": best.get("peak_memory_bytes"),
        "learning_rate": (
            f"a {factor}× larger batch is a different optimisation, not only a faster one: with SGD scale the "
            f"learning rate by {factor} and warm it up over the first epochs (linear scaling rule, Goyal et al. "
            f"2017, https://arxiv.org/abs/1706.02677); with Adam/AdamW start from √{factor} (square-root rule, "
            f"Malladi et al. 2022, https://arxiv.org/abs/2205.10287); keep the number of epochs, not of steps, "
            "and compare validation curves — nndoctor measured speed, not convergence"),
    }
