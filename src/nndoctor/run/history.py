"""What the doctor saw over the steps, kept for the HTML and TensorBoard reports.

A ``HistoryRecorder`` listens to the same events as the checks (it is not a catalog check)
and keeps plain numbers only — no tensor, module or optimizer of the user survives a
handler (observer rule). Memory is bounded for any run length: every series keeps at most
``SERIES_LIMIT`` points, halving its resolution (every other point) when full, and
per-layer series are kept for at most ``MAX_LAYERS`` layers.

What it records:

* **loss** — the tensor passed to ``backward()`` (first backward of each step). On CPU it is
  read at once; on an accelerator the value is copied on the device and read in one
  transfer at the next sampled step, so unsampled steps add no synchronisation.
* **gradient norms** per layer and in total, at sampled steps (the statistics the gradient
  checks compute anyway, shared through the event cache).
* **update/weight ratios** ‖Δw‖/‖w‖ per layer at sampled steps, from a slice (first 4096
  values) of up to 16 weight tensors copied before ``optimizer.step()``.
* **input statistics** (min, max, mean, std) of the model's first input, at sampled steps.
* **activations**: fraction of ReLU outputs at zero and of sigmoid/tanh outputs saturated
  (within 1% of a limit), per layer, at sampled steps.
* **step time** between optimizer steps, and the part spent waiting for the DataLoader.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from nndoctor.core.subscribers import model_forwards_only, sampled_only

SERIES_LIMIT = 1000
MAX_LAYERS = 24
_UPDATE_TENSORS = 16
_UPDATE_SLICE = 4096


@dataclass
class Series:
    """(step, value) points, at most ``limit``: when full, every other point is dropped and
    only every ``stride``-th new point is kept, so a long run keeps an even coverage."""

    limit: int = SERIES_LIMIT
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    stride: int = 1
    _offered: int = 0

    def add(self, step: int, value: float) -> None:
        offered, self._offered = self._offered, self._offered + 1
        if offered % self.stride:
            return
        self.steps.append(int(step))
        self.values.append(float(value))
        if len(self.steps) > self.limit:
            self.steps, self.values = self.steps[::2], self.values[::2]
            self.stride *= 2

    def __len__(self) -> int:
        return len(self.steps)

    def to_json(self) -> dict[str, list]:
        return {"steps": list(self.steps), "values": [_finite_or_none(v) for v in self.values]}


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


class LayerSeries:
    """Series per layer name, for at most ``MAX_LAYERS`` layers (the first ones seen)."""

    def __init__(self) -> None:
        self.layers: dict[str, Series] = {}

    def add(self, layer: str, step: int, value: float) -> None:
        series = self.layers.get(layer)
        if series is None:
            if len(self.layers) >= MAX_LAYERS:
                return
            series = self.layers[layer] = Series()
        series.add(step, value)

    def __bool__(self) -> bool:
        return any(len(s) for s in self.layers.values())

    def to_json(self) -> dict[str, dict[str, list]]:
        return {name: s.to_json() for name, s in self.layers.items() if len(s)}


@dataclass
class RunHistory:
    """The per-step numbers of one run (plain floats; JSON-ready)."""

    loss: Series = field(default_factory=Series)
    grad_norm_total: Series = field(default_factory=Series)
    grad_norms: LayerSeries = field(default_factory=LayerSeries)
    update_ratios: LayerSeries = field(default_factory=LayerSeries)
    inputs: LayerSeries = field(default_factory=LayerSeries)  # stat name -> series
    dead_fraction: LayerSeries = field(default_factory=LayerSeries)
    saturated_fraction: LayerSeries = field(default_factory=LayerSeries)
    step_time: Series = field(default_factory=Series)
    data_wait: Series = field(default_factory=Series)

    def to_json(self) -> dict[str, Any]:
        return {
            "loss": self.loss.to_json(),
            "grad_norm_total": self.grad_norm_total.to_json(),
            "grad_norms": self.grad_norms.to_json(),
            "update_ratios": self.update_ratios.to_json(),
            "inputs": self.inputs.to_json(),
            "dead_fraction": self.dead_fraction.to_json(),
            "saturated_fraction": self.saturated_fraction.to_json(),
            "step_time": self.step_time.to_json(),
            "data_wait": self.data_wait.to_json(),
        }


def layer_of(parameter_name: str) -> str:
    """``Net.features.0.weight`` -> ``features.0`` (the module; the model's class dropped)."""
    parts = parameter_name.split(".")
    if len(parts) > 2:
        parts = parts[1:]
    return ".".join(parts[:-1]) if len(parts) > 1 else parameter_name


class HistoryRecorder:
    """Feeds a RunHistory from the session's events (attached by ``attach``, not registered)."""

    subscriber_name = "report history"

    def __init__(self, session: Any) -> None:
        self.session = session
        self.history = RunHistory()
        self._loss_step = -1
        self._pending_loss: list[tuple[int, Any]] = []
        self._last_step_end: float | None = None
        self._wait_since_step = 0.0
        self._snapshots: dict[int, list[tuple[str, Any, Any]]] = {}
        self._names: tuple[int, dict[int, str]] | None = None

    # -- loss --------------------------------------------------------------------------
    def on_backward(self, event: Any) -> None:
        tensor = event.tensor
        if event.step == self._loss_step or tensor is None or getattr(tensor, "numel", lambda: 0)() != 1:
            return
        self._loss_step = event.step
        import torch

        with torch.no_grad():
            value = tensor.detach()
            if value.device.type == "cpu":
                self.history.loss.add(event.step, float(value.float().reshape(())))
            else:  # read later, all at once, at a sampled step
                self._pending_loss.append((event.step, value.float().reshape(()).clone()))
                if len(self._pending_loss) >= 256:
                    self._flush_losses()

    def _flush_losses(self) -> None:
        if not self._pending_loss:
            return
        import torch

        steps = [s for s, _ in self._pending_loss]
        values = torch.stack([v for _, v in self._pending_loss]).cpu().tolist()
        self._pending_loss = []
        for step, value in zip(steps, values):
            self.history.loss.add(step, value)

    # -- data wait and step time -------------------------------------------------------
    def on_batch(self, event: Any) -> None:
        self._wait_since_step += float(event.wait_s or 0.0)

    # -- gradients and updates ------------------------------------------------------------
    def _parameter_names(self) -> dict[int, str]:
        roots = self.session.state.trained_roots() or list(self.session.state.roots)
        key = sum(id(r) for r in roots)
        if self._names is None or self._names[0] != key:
            names: dict[int, str] = {}
            for root in roots:
                for name, p in root.named_parameters():
                    names.setdefault(id(p), name)
            self._names = (key, names)
        return self._names[1]

    @sampled_only
    def on_step_start(self, event: Any) -> None:
        if not event.sampled or event.optimizer is None:
            return
        from nndoctor.instrument.numerics_probe import cached_gradient_stats

        self._flush_losses()
        stats = cached_gradient_stats(event, self.session)
        if stats is not None:
            self.history.grad_norm_total.add(event.step, stats.total_norm)
            per_layer: dict[str, float] = {}
            for name, norm in zip(stats.names, stats.norms):
                layer = layer_of(name)
                per_layer[layer] = per_layer.get(layer, 0.0) + norm * norm
            for layer, squared in per_layer.items():
                self.history.grad_norms.add(layer, event.step, math.sqrt(squared))
        self._snapshot_weights(event)

    def _snapshot_weights(self, event: Any) -> None:
        import torch

        names = self._parameter_names()
        weights = [p for g in event.optimizer.param_groups for p in g["params"]
                   if p.dim() >= 2 and p.numel() > 0]
        if not weights:
            return
        stride = max(1, math.ceil(len(weights) / _UPDATE_TENSORS))
        chosen = weights[::stride][:_UPDATE_TENSORS]
        with torch.no_grad():
            self._snapshots[id(event.optimizer)] = [
                (layer_of("model." + names.get(id(p), f"param{i}")), weakref.ref(p),
                 p.detach().reshape(-1)[:_UPDATE_SLICE].clone())
                for i, p in enumerate(chosen)
            ]

    def on_step_end(self, event: Any) -> None:
        now = time.perf_counter()
        if self._last_step_end is not None:
            self.history.step_time.add(event.step, now - self._last_step_end)
            self.history.data_wait.add(event.step, self._wait_since_step)
        self._last_step_end, self._wait_since_step = now, 0.0
        snapshot = self._snapshots.pop(id(event.optimizer), None)
        if not snapshot:
            return
        from nndoctor.checks.gradients import update_ratios

        pairs, layers = [], []
        for layer, ref, before in snapshot:
            param = ref()
            if param is None:
                continue
            pairs.append((before, param.detach().reshape(-1)[:_UPDATE_SLICE]))
            layers.append(layer)
        for layer, ratio in zip(layers, update_ratios(pairs)):
            if ratio is not None:
                self.history.update_ratios.add(layer, event.step, ratio)

    # -- inputs and activations -----------------------------------------------------------
    @sampled_only
    @model_forwards_only
    def on_forward(self, event: Any) -> None:
        if not event.sampled or event.is_loss or not event.training or not event.grad_enabled:
            return
        from nndoctor.instrument.stats import cached_stats, first_tensor

        stats = cached_stats(event, "input0", first_tensor(event.inputs))
        if stats is None or not stats.is_floating:
            return
        for name in ("min", "max", "mean", "std"):
            self.history.inputs.add(name, event.step, getattr(stats, name))

    def on_module_output(self, event: Any) -> None:
        module = event.module
        if module is None or not getattr(module, "training", False):
            return
        from nndoctor.checks.numerics import RELU_TYPES, SATURATING_TYPES, saturation_fraction
        from nndoctor.instrument.stats import first_tensor

        output = first_tensor(event.output)
        if output is None or not output.is_floating_point() or output.numel() == 0:
            return
        import torch

        if isinstance(module, RELU_TYPES):
            with torch.no_grad():
                zero = (output.detach() <= 0).mean(dtype=torch.float32)
            self.history.dead_fraction.add(event.qualname, event.step, float(zero))
        elif isinstance(module, SATURATING_TYPES):
            fraction = saturation_fraction(output, module)
            if fraction is not None:
                self.history.saturated_fraction.add(event.qualname, event.step, float(fraction))

    def on_run_end(self, event: Any) -> None:
        self._flush_losses()
        self._snapshots.clear()
        self._names = None


def attach(session: Any) -> RunHistory:
    """Record ``session``'s history from now on; the report carries it (``report.history``)."""
    recorder = HistoryRecorder(session)
    session.subscribe(recorder)
    session.report.history = recorder.history
    return recorder.history
