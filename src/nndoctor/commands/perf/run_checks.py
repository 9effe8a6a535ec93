"""Performance checks that watch a run's events: P102 (DataLoader configuration that costs
time) and P107 (nn.DataParallel), cheap enough for ``nndoctor run`` as well as ``perf``."""

from __future__ import annotations

import time
import weakref
from typing import Any

from nndoctor.checks._timing import TimeBuckets, timing_severity
from nndoctor.commands.perf.detection import (
    DATA_BOUND_FRACTION,
    dataparallel_severity,
    loader_costs_time,
)
from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import model_forwards_only, sampled_only, sampled_training_forwards


def trains_on_accelerator(optimizer: Any) -> bool:
    """Does the optimizer update parameters on a device other than the CPU (CUDA, MPS, XLA …)?"""
    for group in getattr(optimizer, "param_groups", None) or ():
        for param in group.get("params", ())[:64]:
            device = getattr(param, "device", None)
            if device is not None and getattr(device, "type", "cpu") not in ("cpu", "meta"):
                return True
    return False


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
        # When steps ended: the run state's (the hook after every optimizer step writes it).
        self._state = session.state
        self._accelerated = False  # does a GPU (or another accelerator) train on these batches?
        self._devices_checked = 0

    def on_epoch_start(self, event: Any) -> None:
        info = self._loaders.get(id(event.loader))
        if info is None or info["ref"]() is not event.loader:
            # The hook adds every batch's wait to the loader's tally (no event a batch): this
            # check reads it on sampled steps and at the end, from the first step's end on.
            info = self._loaders[id(event.loader)] = {
                "ref": weakref.ref(event.loader), "location": event.location, "tally": event.tally,
                "num_workers": int(getattr(event.loader, "num_workers", 0) or 0)}
            if self._state.first_step_end is not None:
                self._start_counting(info, time.perf_counter())

    @staticmethod
    def _start_counting(info: dict[str, Any], at: float) -> None:
        tally = info["tally"]
        info["base"] = (tally.wait, tally.batches) if tally is not None else (0.0, 0)
        info["waits"] = TimeBuckets(at)  # when the waits were, for the halves of the run
        info["read"] = (at, info["base"][0])

    def _read_tallies(self, now: float) -> None:
        """The waits since the last read, placed in time at the middle of the interval they
        came in (a sampled interval: the halves of the run are off by half of one at most)."""
        for info in self._loaders.values():
            tally = info["tally"]
            if tally is None:
                continue
            if "base" not in info:
                self._start_counting(info, now)
                continue
            then, waited = info["read"]
            if tally.wait > waited:
                info["waits"].add((then + now) / 2, tally.wait - waited)
            info["read"] = (now, tally.wait)

    @sampled_only  # the first steps are sampled: three looks at the optimizer's device are enough
    def on_step_end(self, event: Any) -> None:
        if not event.sampled:
            return
        if self._state.first_step_end is not None:
            self._read_tallies(self._state.last_step_end)
        if not self._accelerated and self._devices_checked < 3:
            self._devices_checked += 1
            self._accelerated = trains_on_accelerator(event.optimizer)

    def on_run_end(self, event: Any) -> None:
        state = self._state
        first, last = state.first_step_end, state.last_step_end
        if first is None:
            return
        wall = last - first
        steps = state.step_ends - 1  # the steps after the first one's end
        self._read_tallies(max(last, time.perf_counter()))
        for info in list(self._loaders.values()):
            if info.get("base") is None:
                continue
            tally, (base_wait, base_batches) = info["tally"], info["base"]
            found = loader_costs_time(info["num_workers"], tally.wait - base_wait, wall,
                                      tally.batches - base_batches, steps)
            if found is None:
                continue
            buckets = info.get("waits")
            halves = (buckets.halves(first, last) if buckets is not None
                      else (0.0, 0.0) if last > first else None)
            severity = timing_severity(found["data_wait_fraction"], halves, DATA_BOUND_FRACTION)
            found["halves"] = [round(h, 4) for h in halves] if halves else None
            found["accelerator"] = self._accelerated
            waited = (f"the loop waited for this DataLoader(num_workers=0) during "
                      f"{found['data_wait_fraction']:.0%} of the step time ({found['mean_wait_ms']:.1f} ms a "
                      f"batch over {found['batches']} batches)")
            if not self._accelerated:
                # The model trains on the CPU: worker processes would compete with the step for the
                # same cores, so whether they help is not known without measuring it.
                found.pop("max_speedup", None)
                self.report(
                    f"{waited}. No accelerator waits for these batches (the model trains on the CPU): worker "
                    f"processes would take cores from the training step itself, so they may make the run "
                    f"faster or slower; nndoctor perf --try loader measures which, on this machine.",
                    location=info["location"], evidence=found, severity=Severity.INFO, step=event.step,
                    fix=("measure before changing it: nndoctor perf --try loader times num_workers 0, 2, 4 … on "
                         "this machine; keep num_workers=0 where it is the fastest"),
                )
                continue
            borderline = ("" if severity == Severity.WARNING else
                          f" Reported as info: the share is not clear of the {DATA_BOUND_FRACTION:.0%} threshold "
                          f"in both halves of the run ({', '.join(f'{h:.0%}' for h in halves or ())}), so "
                          "another run may measure less.")
            self.report(
                f"{waited}: loading in worker processes while the accelerator trains could make steps at most "
                f"{found['max_speedup']:.2f}× faster (an Amdahl bound if loading overlapped the step entirely, "
                f"not a measurement: nndoctor perf --try loader measures it).{borderline}",
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

    @sampled_training_forwards
    @model_forwards_only
    def on_forward(self, event: Any) -> None:
        if event.is_loss:
            return
        import torch

        if not isinstance(event.module, torch.nn.DataParallel):
            return
        device_ids = list(getattr(event.module, "device_ids", None) or [])
        self.report(
            f"training runs through nn.DataParallel over {len(device_ids)} device(s) {device_ids}: "
            "one process scatters, replicates the model and gathers on every step",
            location=event.location, evidence={"device_ids": device_ids},
            severity=dataparallel_severity(device_ids), step=event.step,
        )
