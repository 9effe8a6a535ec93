"""The perf recorder: turns the run's events into per-step phase times and facts about the loop.

It subscribes to the session's events like a check does (``Session.subscribe``), with no catalog code;
``perf/torch/instrument.py`` adds what events do not carry (the start of a top-level forward,
host-to-device copies, host-device syncs). It keeps only numbers, ``Location``s, shapes,
and weak references to the user's model, optimizer, loss module and DataLoader; the one
batch it copies (for ``--try``) is a detached clone taken on the last measured step.
"""

from __future__ import annotations

import statistics
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from nndoctor.commands.perf.config import PerfConfig
from nndoctor.commands.perf.timeline import StepRecord
from nndoctor.commands.perf.torch.kernel_timeline import (
    MIN_UNPROFILED_WARMUP,
    PROFILED_STEPS,
    KernelProfiler,
)
from nndoctor.core.findings import Location
from nndoctor.core.stash import StashKey


@dataclass
class LoopFacts:
    """What the recorder learned about the training loop (plain values only)."""

    loader_config: dict[str, Any] = field(default_factory=dict)
    loader_location: Location | None = None
    loader_dataset: str = ""
    forward_location: Location | None = None
    device: str = "cpu"
    param_dtype: str = ""
    autocast: bool = False
    has_conv: bool = False
    input_shapes: set[tuple] = field(default_factory=set)
    input_channels_last: bool | None = None
    dataparallel: bool = False
    cudnn_benchmark: bool = False
    sync_locations: dict[Location | None, int] = field(default_factory=dict)
    sync_kinds: dict[str, int] = field(default_factory=dict)
    checkpoint_location: Location | None = None
    peak_memory_bytes: int | None = None
    steps_seen: int = 0
    # Kernel-level busy time and idle breakdown of the last warm-up steps (torch.profiler).
    kernel_timeline: dict[str, Any] | None = None
    # The first optimizer stepped: its class and whether it already runs fused / foreach kernels.
    optimizer_name: str = ""
    optimizer_fused: bool | None = None
    optimizer_foreach: bool | None = None
    # The first training forward of the warm-up, traced (perf/torch/sdpa.py's AttentionTracer):
    # None when it was not traced (no warm-up step, or the trace failed).
    attention: dict[str, Any] | None = None
    tf32_matmul: bool = False
    # DistributedDataParallel (perf/torch/ddp_comm.py): its settings, and the all-reduce time of the
    # profiled warm-up steps; None outside a DDP run.
    ddp: dict[str, Any] | None = None
    communication: dict[str, Any] | None = None
    # Backward calls per optimizer step in the window (more than 1: gradient accumulation).
    backwards_per_step: float | None = None


def _first_tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    if isinstance(value, dict):
        for item in value.values():
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _detached_clone(value: Any) -> Any:
    """A copy of a batch structure that shares nothing with the user's tensors."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple):
        return tuple(_detached_clone(v) for v in value)
    if isinstance(value, list):
        return [_detached_clone(v) for v in value]
    if isinstance(value, dict):
        return {k: _detached_clone(v) for k, v in value.items()}
    return value


class PerfRecorder:
    """Internal subscriber of a perf session (an event subscriber, not a catalog check)."""

    subscriber_name = "perf recorder"
    needs = frozenset({"perf_timers"})  # perf/torch/instrument.py, installed only for this subscriber

    def __init__(self, session: Any, config: PerfConfig) -> None:
        self.session = session
        self.config = config
        self.facts = LoopFacts()
        self.records: list[StepRecord] = []
        self.current = StepRecord(step=0)
        self._backwards: list[int] = []  # backward calls of each measured step
        self._backwards_now = 0
        self._last_step_end: float | None = None
        self._phase: str | None = None
        self._phase_started = 0.0
        self._top_forward: int | None = None  # id of the module whose forward is timed
        self._gpu_pending: list[tuple[StepRecord, Any, Any]] = []
        self._gpu_start: Any = None
        self._cuda_roots: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._batches: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        # Weak references to the objects --try needs; the batch copy is ours.
        self.model_ref: weakref.ref | None = None
        self.optimizer_ref: weakref.ref | None = None
        self.loss_module_ref: weakref.ref | None = None
        self.loss_function: str | None = None
        self.loss_options: dict[str, Any] = {}
        self.loader_ref: weakref.ref | None = None
        self.captured_inputs: Any = None
        self.captured_target: Any = None
        self.window_done = False
        self.on_window_end: Any = None  # callable(recorder) set by the perf session
        self._kernel_profiler: Any = None
        self._attention_tracer: Any = None
        self._traced_root: int | None = None

    # -- window ----------------------------------------------------------------------------
    def measuring(self) -> bool:
        """Is the step in progress inside the measured window?"""
        return self.config.warmup <= self.session.step < self.config.last_step

    def capturing(self) -> bool:
        return self.session.step == self.config.last_step - 1

    # -- phases (called by handlers and by perf/torch/instrument.py) -----------------------------
    def begin(self, phase: str) -> bool:
        if self._phase is not None:
            return False
        self._phase, self._phase_started = phase, time.perf_counter()
        return True

    def end(self, phase: str) -> None:
        if self._phase == phase:
            self.current.phases[phase] += time.perf_counter() - self._phase_started
            self._phase = None

    def add_outside_phase(self, phase: str, seconds: float) -> None:
        """Time of a copy or sync; counted only when no enclosing phase already counts it."""
        if self._phase is None:
            self.current.phases[phase] += seconds

    def note_sync(self, kind: str, seconds: float, location: Location | None) -> None:
        self.current.syncs += 1
        self.add_outside_phase("sync", seconds)
        if self.measuring():
            facts = self.facts
            facts.sync_kinds[kind] = facts.sync_kinds.get(kind, 0) + 1
            facts.sync_locations[location] = facts.sync_locations.get(location, 0) + 1

    def forward_begin(self, module: Any) -> None:
        """A top-level module call starts (from the forward pre-hook)."""
        kind = self._module_kind(module)
        if kind is None:  # no parameters: a torchvision transform in the data pipeline, not a model
            return
        if self.begin("forward"):
            self._top_forward = id(module)
            self._trace_attention(module)
        if self._gpu_start is None and self.measuring() and kind == "cuda":
            self._gpu_start = _cuda_event()

    def _module_kind(self, module: Any) -> str | None:
        """The device type of a module's parameters (None for a module without any), cached."""
        known = self._cuda_roots.get(module)
        if known is None:
            param = next(iter(module.parameters()), None)
            known = "" if param is None else param.device.type
            self._cuda_roots[module] = known
        return known or None

    # -- event handlers ----------------------------------------------------------------------
    def on_epoch_start(self, event: Any) -> None:
        loader = event.loader
        facts = self.facts
        if facts.loader_location is None or self.loader_ref is None or self.loader_ref() is None:
            facts.loader_location = event.location
            facts.loader_config = loader_config(loader)
            facts.loader_dataset = type(getattr(loader, "dataset", None)).__name__
            self.loader_ref = weakref.ref(loader)

    def on_batch(self, event: Any) -> None:
        self.current.phases["data"] += event.wait_s
        tensor = _first_tensor(event.batch)
        if tensor is not None and tensor.dim() > 0:
            self.current.samples += int(tensor.shape[0])
        loader = event.loader
        if loader is not None:
            self._batches[loader] = self._batches.get(loader, 0) + 1

    def _trace_attention(self, module: Any) -> None:
        """Trace the first training forward of the warm-up (never a measured step): which
        attention it runs, hand-written or fused, and its share of the matmul work."""
        if (self.facts.attention is not None or self._attention_tracer is not None or self.config.warmup < 1
                or self.session.step != 0 or not getattr(module, "training", False)):
            return
        try:
            import torch

            if not torch.is_grad_enabled():
                return
            from nndoctor.commands.perf.torch.sdpa import AttentionTracer

            self._attention_tracer = AttentionTracer()
            self._traced_root = id(module)
            self._attention_tracer.start(module)
        except Exception as error:  # noqa: BLE001 - observer rule: the prediction goes without it
            self._finish_attention_trace(error)

    def _finish_attention_trace(self, error: BaseException | None = None) -> None:
        tracer, self._attention_tracer = self._attention_tracer, None
        if tracer is None:
            return
        try:
            tracer.stop()
        except Exception as stop_error:  # noqa: BLE001
            error = error or stop_error
        if error is not None:
            self.facts.attention = {"traced": False, "error": f"{type(error).__name__}: {error}"}
            return
        self.facts.attention = {
            "traced": True, "handwritten_modules": [type(m).__name__ for m in tracer.modules],
            "handwritten": len(tracer.modules), "sdpa_calls": tracer.sdpa_calls,
            "attention_flop_share": (tracer.attention_flops / tracer.matmul_flops if tracer.matmul_flops else 0.0),
        }

    def on_forward(self, event: Any) -> None:
        module = event.module
        if self._attention_tracer is not None and self._traced_root == id(module):
            self._finish_attention_trace()
        if self._phase == "forward" and self._top_forward == id(module):
            self.end("forward")
            self._top_forward = None
        if event.is_loss or not event.grad_enabled or not event.training:
            return
        if self._module_kind(module) is None:  # a parameterless transform, not the trained model
            return
        import torch

        facts = self.facts
        self.model_ref = weakref.ref(module)
        facts.dataparallel = facts.dataparallel or isinstance(module, torch.nn.DataParallel)
        self._note_ddp(module)
        if facts.forward_location is None:
            facts.forward_location = event.location
            param = next(iter(module.parameters()))
            facts.device = param.device.type
            facts.param_dtype = str(param.dtype).replace("torch.", "")
            facts.has_conv = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in module.modules())
        if facts.device in ("cuda", "cpu") and torch.is_autocast_enabled(facts.device):
            facts.autocast = True
        facts.cudnn_benchmark = bool(torch.backends.cudnn.benchmark)
        x = _first_tensor(event.inputs)
        if x is not None and self.measuring():
            facts.input_shapes.add(tuple(x.shape))
            if x.dim() == 4:
                facts.input_channels_last = bool(
                    x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
                )
        if self.capturing() and self.captured_inputs is None:
            self.captured_inputs = _detached_clone(tuple(event.inputs))

    def on_loss(self, event: Any) -> None:
        if event.module is not None:
            self.loss_module_ref = weakref.ref(event.module)
            self.loss_function = None
        else:
            self.loss_module_ref = None
            self.loss_function = event.function
            self.loss_options = {k: v for k, v in event.options.items() if not hasattr(v, "shape")}
        if self.capturing() and self.captured_target is None and event.target is not None:
            self.captured_target = _detached_clone(event.target)

    def _note_ddp(self, module: Any) -> None:
        if type(module).__name__ != "DistributedDataParallel":
            return
        if self.facts.ddp is None:
            from nndoctor.commands.perf.torch.ddp_comm import ddp_facts

            self.facts.ddp = ddp_facts(module)
        if self.facts.ddp is None:
            return
        if not getattr(module, "require_backward_grad_sync", True):
            self.facts.ddp["no_sync_seen"] = True  # the script accumulates under no_sync() already
        if self.facts.ddp["find_unused_parameters"]:
            from nndoctor.commands.perf.torch.ddp_comm import note_unused

            note_unused(self.facts.ddp, module)

    def on_backward(self, event: Any) -> None:
        self._backwards_now += 1
        self.begin("backward")

    def on_backward_done(self, event: Any) -> None:
        self.end("backward")

    def on_step_start(self, event: Any) -> None:
        self.optimizer_ref = weakref.ref(event.optimizer)
        if not self.facts.optimizer_name:
            self._note_optimizer(event.optimizer)
        self.begin("optimizer")

    def _note_optimizer(self, optimizer: Any) -> None:
        while hasattr(optimizer, "optimizer") and not hasattr(optimizer, "param_groups"):
            optimizer = optimizer.optimizer  # a wrapper (Accelerate, AMP scaler shims)
        facts = self.facts
        facts.optimizer_name = type(optimizer).__name__
        groups = getattr(optimizer, "param_groups", None) or [{}]
        facts.optimizer_fused = any(bool(g.get("fused")) for g in groups)
        foreach = [g.get("foreach") for g in groups]
        facts.optimizer_foreach = None if all(f is None for f in foreach) else any(bool(f) for f in foreach)

    def on_checkpoint_save(self, event: Any) -> None:
        self.add_outside_phase("io", event.seconds)
        if self.facts.checkpoint_location is None:
            self.facts.checkpoint_location = event.location

    def on_step_end(self, event: Any) -> None:
        self.end("optimizer")
        self._profile_warmup_steps(event.step)  # before the clock: its cost stays out of the window
        now = time.perf_counter()
        record, self.current = self.current, StepRecord(step=event.step)
        record.step = event.step
        self._phase = None
        backwards, self._backwards_now = self._backwards_now, 0
        if self._last_step_end is not None and self.config.warmup < event.step <= self.config.last_step:
            self._backwards.append(backwards)
            record.wall = now - self._last_step_end
            self.records.append(record)
            if self._gpu_start is not None:
                self._gpu_pending.append((record, self._gpu_start, _cuda_event()))
        self._gpu_start = None
        self._last_step_end = now
        self.facts.steps_seen = event.step
        if event.step >= self.config.last_step and not self.window_done:
            self.close_window()

    def on_run_end(self, event: Any) -> None:
        if self._attention_tracer is not None:
            self._finish_attention_trace(RuntimeError("the traced forward did not return"))
        if self._kernel_profiler is not None:
            self._kernel_profiler.abandon()  # the run ended inside the profiled steps
        if not self.window_done:
            self.close_window()

    def _profile_warmup_steps(self, step: int) -> None:
        """Profile the last warm-up steps (kernel timeline) on CUDA; never the measured window."""
        profiler = self._kernel_profiler
        try:
            if profiler is None:
                cuda, ddp = self.facts.device == "cuda", self.facts.ddp is not None
                if (cuda or ddp) and step == profile_start(self.config.warmup, ddp):
                    from nndoctor.commands.perf.torch.ddp_comm import comm_from_events

                    self._kernel_profiler = KernelProfiler(comm=comm_from_events if ddp else None, cuda=cuda, defer=ddp)
                    self._kernel_profiler.start()
            elif profiler.profiler is not None and profiler.step_ended() and not profiler.defer:
                self.facts.kernel_timeline = profiler.result
        except Exception as error:  # noqa: BLE001 - observer rule: fall back to CUDA events
            if profiler is not None:
                profiler.abandon()
            self._kernel_profiler = KernelProfiler(steps=0)  # not tried again
            self.facts.kernel_timeline = {"error": f"{type(error).__name__}: {error}"}
            if self.facts.ddp is not None:
                self.facts.communication = {"error": f"{type(error).__name__}: {error}"}

    # -- end of the window -------------------------------------------------------------------
    def close_window(self) -> None:
        """Resolve GPU timings (one synchronisation, after the window) and run the trials."""
        self.window_done = True
        if self._backwards:
            self.facts.backwards_per_step = statistics.median(self._backwards)
        profiler = self._kernel_profiler
        if profiler is not None and profiler.defer and profiler.stopped is not None:
            try:
                profiler.analyze()  # after the window: reading the events here delays no rank's step
                self.facts.kernel_timeline = profiler.result
                self.facts.communication = profiler.comm_result
            except Exception as error:  # noqa: BLE001 - observer rule
                self.facts.communication = {"error": f"{type(error).__name__}: {error}"}
        model = self.model_ref() if self.model_ref is not None else None
        if self.facts.ddp is not None and model is not None:
            from nndoctor.commands.perf.torch.ddp_comm import note_buckets

            note_buckets(self.facts.ddp, model)
        if self.facts.ddp is not None and self.facts.communication is None:
            self.facts.communication = {"missing": f"the warm-up is too short to profile (--warmup "
                                                   f"{self.config.warmup}; at least "
                                                   f"{PROFILED_STEPS + MIN_UNPROFILED_WARMUP} needed)"}
        try:
            import torch

            self.facts.tf32_matmul = bool(torch.backends.cuda.matmul.allow_tf32
                                          or torch.get_float32_matmul_precision() != "highest")
        except Exception:  # noqa: BLE001 - a torch without these flags: TF32 reads as off
            pass
        if self._gpu_pending:
            import torch

            torch.cuda.synchronize()
            for record, start, end in self._gpu_pending:
                record.gpu_busy = start.elapsed_time(end) / 1000.0
            self._gpu_pending.clear()
            self.facts.peak_memory_bytes = int(torch.cuda.max_memory_allocated())
        if self.on_window_end is not None:
            self.on_window_end(self)


# Under DDP the profiler stops unevenly on each rank and the next steps run slower (measured on
# gloo: 75 vs 127 ms to stop, then two steps 3–10× the steady step): two unprofiled steps
# separate the profiled ones from the window when the warm-up is long enough.
DDP_SETTLE_STEPS = 2


def profile_start(warmup: int, ddp: bool) -> int | None:
    """The step after which the profiled warm-up steps start (None: the warm-up is too short)."""
    if ddp and warmup - PROFILED_STEPS - DDP_SETTLE_STEPS >= MIN_UNPROFILED_WARMUP:
        return warmup - PROFILED_STEPS - DDP_SETTLE_STEPS
    start = warmup - PROFILED_STEPS
    return start if start >= MIN_UNPROFILED_WARMUP else None


def loader_config(loader: Any) -> dict[str, Any]:
    """The DataLoader settings that decide its speed (plain values)."""
    return {
        "num_workers": int(getattr(loader, "num_workers", 0) or 0),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "batch_size": getattr(loader, "batch_size", None),
        # DataLoader(sampler=BatchSampler(...), batch_size=None): the batches' size is the
        # sampler's, and --try batch-size scales every BatchSampler (perf/torch/inject.py).
        "sampler_batch_size": _sampler_batch_size(loader),
    }


def _sampler_batch_size(loader: Any) -> int | None:
    for sampler in (getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)):
        size = getattr(sampler, "batch_size", None)
        if isinstance(size, int) and size > 0:
            return size
    return None


def _cuda_event() -> Any:
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


# The recorder of a perf session, where perf/torch/instrument.py finds it (perf/torch/backend.py puts it there).
PERF_RECORDER = StashKey[PerfRecorder]("perf: the PyTorch step recorder")
