"""The active tests of preflight, each on copies of the user's model: batch independence
(M107), overfitting one real batch (H101), finite-difference checks of custom autograd
Functions (H102), the loss at initialisation (L105) and the first batch's sanity.

Every test takes a ``StepRecipe`` (the model, its optimizer, a copy of the first batch and
how the loss is computed from the model's output) and returns a ``TestResult``; none of them
touches the user's model, optimizer or random number generators (the caller forks the RNG).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from nndoctor.core.findings import Location

MIXING_RELATIVE = 1e-6  # gradient to other samples, relative to the sample's own
OVERFIT_STEPS = 60
OVERFIT_TARGET = 0.5  # the loss must reach this fraction of its start …
OVERFIT_ABSOLUTE = 0.05  # … or this absolute value
# Failure: no attempt moved the loss by more than this fraction of its start. In between the
# test is inconclusive (a frozen backbone's head, a small learning rate), never a finding.
NOT_MOVED = 0.10
OVERFIT_LR_SCALES = (1.0, 10.0)
STUCK_STEPS = 20
GRADCHECK_TOLERANCE = 1e-4
GRADCHECK_EPS = 1e-6
MAX_PROBED_MODULES = 200


@dataclass
class StepRecipe:
    model: Any
    optimizer: Any
    inputs: tuple
    kwargs: dict
    loss_of_output: Callable[[Any], Any] | None  # output -> scalar loss
    loss_description: str = ""
    target: Any = None
    location: Location | None = None
    skip_reason: str | None = None


@dataclass
class TestResult:
    name: str
    status: str  # passed | failed | skipped | inconclusive
    seconds: float = 0.0
    detail: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "seconds": round(self.seconds, 3),
                "detail": self.detail, "evidence": self.evidence}


# -- helpers --------------------------------------------------------------------------------

def first_tensor(value: Any) -> torch.Tensor | None:
    """The prediction tensor of a model output: a tensor, ``.logits``, a dict's ``logits`` or first tensor."""
    if isinstance(value, torch.Tensor):
        return value
    logits = getattr(value, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(value, dict):
        if isinstance(value.get("logits"), torch.Tensor):
            return value["logits"]
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def clone_batch(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: clone_batch(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [clone_batch(v) for v in value]
        return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
    return value


def batch_size_of(recipe: StepRecipe) -> int | None:
    if isinstance(recipe.target, torch.Tensor) and recipe.target.dim() >= 1:
        return int(recipe.target.shape[0])
    tensor = first_tensor(list(recipe.inputs) + list(recipe.kwargs.values()))
    return int(tensor.shape[0]) if tensor is not None and tensor.dim() >= 1 else None


def batch_dim(tensor: torch.Tensor, batch: int) -> int | None:
    """The batch dimension: 0, else 1 (sequence-first RNN layouts), None when absent."""
    for dim in range(min(2, tensor.dim())):
        if tensor.shape[dim] == batch:
            return dim
    return None


def estimate_copy_bytes(model: Any) -> int:
    """Parameters, their gradients and two optimizer states per parameter, plus buffers."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return 4 * params + buffers


def available_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def model_device(model: Any) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def unwrap_optimizer(optimizer: Any) -> Any:
    """accelerate's AcceleratedOptimizer and similar wrappers keep the real one in ``.optimizer``."""
    seen = 0
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer") and seen < 5:
        optimizer, seen = optimizer.optimizer, seen + 1
    return optimizer


def copy_optimizer(optimizer: Any, model: Any, model_copy: Any, lr_scale: float) -> torch.optim.Optimizer | None:
    """A fresh optimizer of the user's class and group settings over the copy's parameters."""
    optimizer = unwrap_optimizer(optimizer)
    mapping = {id(p): q for p, q in zip(model.parameters(), model_copy.parameters(), strict=True)}
    groups = []
    for group in optimizer.param_groups:
        params = [mapping[id(p)] for p in group["params"] if id(p) in mapping]
        if not params:
            continue
        settings = {k: v for k, v in group.items() if k not in ("params", "initial_lr")}
        lr = settings.get("lr", 0.0)
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        if not lr:
            lr = group.get("initial_lr", 0.0)  # a warm-up schedule starts at 0: use its target
        settings["lr"] = float(lr) * lr_scale
        groups.append({"params": params, **settings})
    if not groups or not any(g["lr"] for g in groups):
        return None
    try:
        return type(optimizer)(groups)
    except TypeError:
        return type(optimizer)(groups, lr=groups[0]["lr"])


def _random_like(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(tensor.shape, generator=generator, dtype=torch.float64).to(tensor.device, tensor.dtype)


def _forward(model: Any, recipe: StepRecipe, inputs: tuple | None = None) -> Any:
    return model(*(recipe.inputs if inputs is None else inputs), **recipe.kwargs)


# -- M107 batch independence ----------------------------------------------------------------

def _mixing(output: torch.Tensor, out_dim: int, probe: torch.Tensor, probe_dim: int,
            generator: torch.Generator) -> tuple[float, float] | None:
    """(gradient to sample 0's own input, largest gradient to the other samples)."""
    weights = _random_like(output.select(out_dim, 0), generator)
    grad = torch.autograd.grad((output.select(out_dim, 0) * weights).sum(), probe, retain_graph=True,
                               allow_unused=True)[0]
    if grad is None:
        return None
    own = float(grad.select(probe_dim, 0).abs().max())
    others = float(grad.narrow(probe_dim, 1, grad.shape[probe_dim] - 1).abs().max())
    return own, others


def _record(recorded: list[tuple[str, torch.Tensor]], name: str, output: Any) -> None:
    tensor = output if isinstance(output, torch.Tensor) else (
        output[0] if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor) else None)
    if tensor is not None:
        recorded.append((name, tensor))


def _mixes(own: float, others: float) -> bool:
    return others > 0 and others > MIXING_RELATIVE * own


def batch_independence(recipe: StepRecipe) -> TestResult:
    started = time.perf_counter()
    result = TestResult("batch independence (M107)", "skipped")
    batch = batch_size_of(recipe)
    if batch is None or batch < 2:
        result.detail = "needs a batch of at least 2 samples"
        return result
    model = copy.deepcopy(recipe.model).eval()
    batch_stat_layers = [n for n, m in model.named_modules()
                         if isinstance(m, torch.nn.modules.batchnorm._NormBase) and not m.track_running_stats]
    if batch_stat_layers:
        result.detail = f"{batch_stat_layers[0]} normalises with batch statistics even in eval mode"
        return result
    recorded: list[tuple[str, torch.Tensor]] = []
    hooks = []
    for name, module in model.named_modules():
        if name:
            hooks.append(module.register_forward_hook(
                lambda m, i, o, name=name: _record(recorded, name, o)))
    inputs = list(recipe.inputs)
    probe, probe_name = None, "the input batch"
    for index, value in enumerate(inputs):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and batch_dim(value, batch) is not None:
            probe = inputs[index] = value.detach().clone().requires_grad_(True)
            break
    try:
        with torch.enable_grad():
            output = first_tensor(_forward(model, recipe, tuple(inputs)))
            if probe is None:  # token ids: probe the first float activation instead (embeddings)
                for name, tensor in recorded:
                    if tensor.is_floating_point() and tensor.requires_grad and batch_dim(tensor, batch) is not None:
                        probe, probe_name = tensor, f"the output of {name}"
                        break
            if probe is None or output is None or not output.is_floating_point():
                result.detail = "no floating-point input or activation with a batch dimension to differentiate"
                return result
            probe_dim, out_dim = batch_dim(probe, batch), batch_dim(output, batch)
            assert probe_dim is not None  # the probe was chosen for having a batch dimension
            if out_dim is None:
                result.detail = f"the output {list(output.shape)} has no batch dimension of size {batch}"
                return result
            generator = torch.Generator().manual_seed(0)
            measured = _mixing(output, out_dim, probe, probe_dim, generator)
            if measured is None:
                result.detail = f"the output does not depend on {probe_name}"
                return result
            own, others = measured
            result.evidence = {"batch_size": batch, "probe": probe_name, "grad_own_sample": own,
                               "grad_other_samples": others}
            if not _mixes(own, others):
                result.status, result.detail = "passed", f"sample 0's output depends on no other sample (batch of {batch})"
                return result
            first = None
            for name, tensor in recorded[:MAX_PROBED_MODULES]:
                dim = batch_dim(tensor, batch)
                if dim is None or not tensor.is_floating_point() or not tensor.requires_grad or tensor is probe:
                    continue
                inner = _mixing(tensor, dim, probe, probe_dim, generator)
                if inner is not None and _mixes(*inner):
                    first = (name, type(dict(model.named_modules())[name]).__name__, inner)
                    break
            result.status = "failed"
            result.evidence["first_mixing_module"] = first[0] if first else None
            where = (f"; samples first mix at {first[0]} ({first[1]}), whose output for sample 0 has a gradient "
                     f"of {first[2][1]:.3g} from the other samples" if first else "")
            result.detail = (f"the output for sample 0 changes with the other {batch - 1} samples of the batch "
                             f"(largest gradient to another sample {others:.3g}, to its own {own:.3g}){where}")
            return result
    finally:
        for hook in hooks:
            hook.remove()
        result.seconds = time.perf_counter() - started


# -- H101 overfit one batch -----------------------------------------------------------------

def _overfit_attempt(recipe: StepRecipe, lr_scale: float, deadline: float) -> list[float] | None:
    model = copy.deepcopy(recipe.model).train()
    optimizer = copy_optimizer(recipe.optimizer, recipe.model, model, lr_scale)
    if optimizer is None:
        return None
    losses: list[float] = []

    def closure():
        optimizer.zero_grad(set_to_none=True)
        loss = recipe.loss_of_output(_forward(model, recipe))
        loss.backward()
        return loss

    with torch.enable_grad():
        for _ in range(OVERFIT_STEPS):
            loss: Any = optimizer.step(closure)  # the closure's loss tensor
            value = float(loss.detach())
            losses.append(value)
            if (not math.isfinite(value) or time.perf_counter() > deadline or _overfitted(losses)
                    or _stuck(losses)):
                break
    return losses


def _overfitted(losses: list[float]) -> bool:
    start, best = losses[0], min(losses)
    return best <= OVERFIT_ABSOLUTE or (start > 0 and best <= OVERFIT_TARGET * start)


def _moved(losses: list[float]) -> bool:
    """Did the loss fall by more than NOT_MOVED of its start at some point?"""
    start = losses[0]
    return start > 0 and min(losses) < (1 - NOT_MOVED) * start


def _stuck(losses: list[float]) -> bool:
    """Twenty steps that moved the loss by under 1% of its start: more steps will not help."""
    return len(losses) >= STUCK_STEPS and losses[0] - min(losses) < 0.01 * abs(losses[0])


def _curve(losses: list[float]) -> str:
    picks = sorted({0, len(losses) // 2, len(losses) - 1})
    return " → ".join(f"{losses[i]:.4g}" for i in picks) + f" in {len(losses)} steps (best {min(losses):.4g})"


def overfit_one_batch(recipe: StepRecipe, budget_s: float) -> tuple[TestResult, float | None]:
    """The test and the initial loss of the copy (for the L105 comparison)."""
    started = time.perf_counter()
    result = TestResult("overfit one batch (H101)", "skipped")
    if recipe.loss_of_output is None:
        result.detail = recipe.skip_reason or "the loss could not be rebuilt from the model's output"
        return result, None
    deadline = started + budget_s
    curves: dict[str, list[float]] = {}
    initial = None
    try:
        for scale in OVERFIT_LR_SCALES:
            losses = _overfit_attempt(recipe, scale, deadline)
            if losses is None:
                result.detail = "the optimizer's learning rate is 0 for this model's parameters"
                return result, None
            label = "user's learning rate" if scale == 1 else f"{scale:g}× learning rate"
            curves[label] = losses
            initial = losses[0] if initial is None else initial
            if _overfitted(losses):
                result.status = "passed"
                result.detail = f"with the {label}: {_curve(losses)}"
                break
            if time.perf_counter() > deadline:
                break
        else:
            result.status = "failed" if not any(_moved(losses) for losses in curves.values()) else "inconclusive"
        if result.status == "skipped":  # stopped by the time budget before a verdict
            result.status = "inconclusive"
        if result.status != "passed":
            result.detail = "; ".join(f"{label}: {_curve(losses)}" for label, losses in curves.items())
            if result.status == "inconclusive":
                result.detail += f" (time budget of {budget_s:.0f} s reached)"
        result.evidence = {"losses": {k: [round(v, 5) for v in vs] for k, vs in curves.items()},
                           "loss": recipe.loss_description}
        return result, initial
    finally:
        result.seconds = time.perf_counter() - started


# -- H102 custom autograd Functions ---------------------------------------------------------

def custom_functions(loss: torch.Tensor, limit: int = 10_000) -> list[type]:
    """The ``torch.autograd.Function`` subclasses in ``loss``'s graph, in discovery order."""
    found: list[type] = []
    seen: set[int] = set()
    stack = [loss.grad_fn]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        cls = getattr(node, "_forward_cls", None)
        if cls is not None and cls not in found:
            found.append(cls)
        stack.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
    return found


def _record_calls(classes: list[Any], run: Callable[[], Any]) -> dict[Any, tuple]:
    """Run ``run`` with each class's ``apply`` recording its first call's arguments (the
    classes are the user's Function subclasses, patched for the call and restored)."""
    calls: dict[Any, tuple] = {}
    patched = []
    for cls in classes:
        original = cls.apply

        def recording(*args, _cls=cls, _original=original, **kwargs):
            if _cls not in calls and not kwargs:
                calls[_cls] = tuple(clone_batch(a) for a in args)
            return _original(*args, **kwargs)

        raw = cls.__dict__.get("apply")
        cls.apply = staticmethod(recording)
        patched.append((cls, raw))
    try:
        run()
    finally:
        for cls, raw in patched:
            if raw is None:
                del cls.apply  # back to the inherited Function.apply
            else:
                cls.apply = raw
    return calls


def directional_error(function: type[torch.autograd.Function], args: tuple, generator: torch.Generator) -> float | None:
    """|numerical − analytical| directional derivative, relative, in float64 (None: not testable)."""
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if not positions:
        return None
    base = [a.detach().double() if i in positions else a for i, a in enumerate(args)]

    def call(values: list[Any]) -> list[torch.Tensor]:
        out = function.apply(*values)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]

    leaves = [a.clone().requires_grad_(True) if i in positions else a for i, a in enumerate(base)]
    with torch.enable_grad():
        outputs = call(leaves)
    if not outputs or any(o.dtype != torch.float64 for o in outputs):
        return None  # the Function casts internally: float64 finite differences would not be comparable
    weights = [_random_like(o, generator) for o in outputs]
    direction = {i: _random_like(base[i], generator) for i in positions}
    # A tensor (outputs is not empty), though sum() is typed as possibly returning its start, 0.
    objective: torch.Tensor = sum((o * w).sum() for o, w in zip(outputs, weights, strict=True))  # type: ignore[assignment]
    grads = torch.autograd.grad(objective, [leaves[i] for i in positions], allow_unused=True)
    analytical = sum(float((g * direction[i]).sum()) for g, i in zip(grads, positions, strict=True) if g is not None)
    with torch.no_grad():
        plus = call([a + GRADCHECK_EPS * direction[i] if i in direction else a for i, a in enumerate(base)])
        minus = call([a - GRADCHECK_EPS * direction[i] if i in direction else a for i, a in enumerate(base)])
    numerical = sum(float(((p - m) * w).sum()) for p, m, w in zip(plus, minus, weights, strict=True)) / (2 * GRADCHECK_EPS)
    return abs(numerical - analytical) / max(1.0, abs(numerical), abs(analytical))


def check_custom_functions(recipe: StepRecipe) -> tuple[TestResult, list[dict[str, Any]]]:
    started = time.perf_counter()
    result = TestResult("gradcheck of custom autograd Functions (H102)", "skipped")
    failures: list[dict[str, Any]] = []
    try:
        model = copy.deepcopy(recipe.model).train()
        with torch.enable_grad():
            output = _forward(model, recipe)
            root = recipe.loss_of_output(output) if recipe.loss_of_output else first_tensor(output)
        if root is None or root.grad_fn is None:
            result.detail = "the forward pass has no autograd graph"
            return result, failures
        classes = custom_functions(root)
        if not classes:
            result.status, result.detail = "passed", "no custom autograd Function in the forward pass"
            return result, failures
        with torch.enable_grad():
            calls = _record_calls(classes, lambda: _forward(model, recipe))
        generator = torch.Generator().manual_seed(0)
        checked, untestable = [], []
        for cls, args in calls.items():
            try:
                errors = [directional_error(cls, args, generator) for _ in range(2)]
            except Exception as error:  # noqa: BLE001 - a Function that cannot run in float64 is skipped, not failed
                untestable.append(f"{cls.__qualname__} ({type(error).__name__})")
                continue
            if any(e is None for e in errors):
                untestable.append(f"{cls.__qualname__} (not float64-clean)")
                continue
            worst = max(e for e in errors if e is not None)  # all of them (checked above)
            checked.append(cls.__qualname__)
            if worst > GRADCHECK_TOLERANCE:
                shapes = [list(a.shape) for a in args if isinstance(a, torch.Tensor)]
                failures.append({"function": f"{cls.__module__}.{cls.__qualname__}", "input_shapes": shapes,
                                 "relative_error": worst})
        result.evidence = {"checked": checked, "untestable": untestable, "failures": failures}
        if failures:
            result.status = "failed"
            result.detail = "; ".join(f"{f['function']} backward is off by {f['relative_error']:.3g} (relative)"
                                      for f in failures)
        elif checked:
            result.status = "passed"
            result.detail = f"{', '.join(checked)} match finite differences"
            if untestable:
                result.detail += f"; not testable: {', '.join(untestable)}"
        else:
            result.detail = f"not testable: {', '.join(untestable)}"
        return result, failures
    finally:
        result.seconds = time.perf_counter() - started


# -- first batch ----------------------------------------------------------------------------

def first_batch_sanity(recipe: StepRecipe) -> TestResult:
    started = time.perf_counter()
    notes, problems = [], []
    tensors = [t for t in list(recipe.inputs) + list(recipe.kwargs.values()) if isinstance(t, torch.Tensor)]
    for tensor in tensors:
        if tensor.is_floating_point():
            finite = bool(torch.isfinite(tensor).all())
            if not finite:
                problems.append(f"non-finite values in an input {list(tensor.shape)}")
            else:
                notes.append(f"input {list(tensor.shape)} in [{float(tensor.min()):.3g}, {float(tensor.max()):.3g}]")
            if tensor.dim() >= 2 and tensor.shape[0] >= 2:
                flat = tensor.reshape(tensor.shape[0], -1)
                if bool((flat == flat[:1]).all()):
                    problems.append(f"all {tensor.shape[0]} samples of an input are identical")
    target = recipe.target
    if isinstance(target, torch.Tensor) and not target.is_floating_point() and target.numel() >= 2:
        distinct = int(torch.unique(target).numel())
        notes.append(f"{distinct} distinct label(s) in {target.numel()}")
        if distinct == 1:
            problems.append(f"every label of the first batch is {int(target.flatten()[0])}")
    status = "failed" if problems else "passed"
    return TestResult("first batch sanity", status, time.perf_counter() - started,
                      "; ".join(problems or notes) or "no tensors in the batch")
