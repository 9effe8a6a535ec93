"""Which parameters the optimizers update: M103, M104, M105, M106."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from nndoctor.checks._params import (
    has_any_grad,
    learning_rates,
    named_params_of,
    optimizer_params,
    spread_sample,
    value_slice,
)
from nndoctor.checks._source import attribute_definition
from nndoctor.core.events import ManualStep, RunEnd, StepEnd, StepStart
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import sampled_only


@register
class ParamsMissingFromOptimizer(Check):
    """
    ## What it does
    At sampled optimizer steps, looks for parameters of a trained model that received a
    gradient but belong to no optimizer's param groups.

    ## Why is this bad?
    Those parameters never change. The usual causes: a layer added or replaced *after*
    the optimizer was built (`model.fc = nn.Linear(512, 10)` after
    `optimizer = SGD(model.parameters())`), or an optimizer built from another copy of the
    model. Training looks normal; the new head stays at its random init.

    ## Example
    ```python
    model = torchvision.models.resnet18()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.fc = nn.Linear(512, 10)        # new parameters, unknown to the optimizer
    ```

    ## Use instead
    ```python
    model = torchvision.models.resnet18()
    model.fc = nn.Linear(512, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ```
    To freeze part of a model on purpose, set `requires_grad_(False)` on it: it then gets
    no gradient (no wasted compute) and is not reported.

    ## References
    - PyTorch docs, "Constructing an optimizer": https://pytorch.org/docs/stable/optim.html
    """

    code = "M103"
    name = "params-missing-from-optimizer"
    severity = Severity.WARNING
    summary = "parameters that receive gradients belong to no optimizer (layer added after the optimizer was built)"
    fix = ("build the optimizer after the model is complete (or optimizer.add_param_group(...)); "
           "to freeze parameters on purpose use requires_grad_(False)")

    def __init__(self, session) -> None:
        super().__init__(session)
        self._reported: set[str] = set()

    @sampled_only
    def on_step_start(self, event: StepStart) -> None:
        if not event.sampled:
            return
        owners = self.session.state.optimizer_param_ids()
        missing: list[str] = []
        numel = 0
        for root in self.session.state.trained_roots():
            prefix = type(root).__name__
            for name, p in root.named_parameters():
                if p.requires_grad and p.grad is not None and id(p) not in owners:
                    missing.append(f"{prefix}.{name}")
                    numel += p.numel()
        fresh = [m for m in missing if m not in self._reported]
        if not fresh:
            return
        self._reported.update(missing)
        self.report(
            f"{len(missing)} parameter tensor(s) ({numel:,} values) receive gradients but no optimizer "
            f"updates them, e.g. {', '.join(missing[:3])}: they keep their initial values.",
            location=event.location,
            evidence={"parameters": missing, "numel": numel},
            step=event.step,
        )


@register
class StaleOptimizerParams(Check):
    """
    ## What it does
    At sampled optimizer steps, finds tensors in an optimizer's param groups that no
    longer belong to the model being trained: they get no gradient while the optimizer's
    other parameters do, and no model seen running holds them.

    ## Why is this bad?
    A parameter replaced by assignment (`model.fc.weight = nn.Parameter(...)`,
    `model.head = new_head`) leaves the optimizer updating the old tensor, which nothing
    uses, while the new one is never updated. Optimizer state such as Adam
    moments also keeps the stale tensors alive.

    ## Example
    ```python
    optimizer = torch.optim.Adam(model.parameters())
    model.classifier = nn.Linear(256, 5)   # the optimizer still holds the old classifier
    ```

    ## Use instead
    ```python
    model.classifier = nn.Linear(256, 5)
    optimizer = torch.optim.Adam(model.parameters())   # rebuild after changing the model
    # or update in place: with torch.no_grad(): model.fc.weight.copy_(new_weight)
    ```

    ## References
    - PyTorch forums, "Optimizer does not update replaced parameters".
    """

    code = "M104"
    name = "stale-optimizer-params"
    severity = Severity.ERROR
    summary = "the optimizer updates tensors that are no longer part of the model (parameter replaced by assignment)"
    fix = "rebuild the optimizer after replacing layers, or copy new values into the existing parameters in place"

    @sampled_only
    def on_step_start(self, event: StepStart) -> None:
        if not event.sampled or event.has_closure or event.step < 1:
            return
        params = optimizer_params(event.optimizer)
        if not any(p.grad is not None for p in params):
            return
        roots = self.session.state.trained_roots()
        in_models = named_params_of(roots)
        stale = [p for p in params if p.grad is None and id(p) not in in_models and p.requires_grad]
        if not stale or not any(id(p) in in_models for p in params):
            return
        owners = self.session.state.optimizer_param_ids()
        shapes = [tuple(p.shape) for p in stale]
        replacements = sorted({name for root in roots for name, p in
                               ((f"{type(root).__name__}.{n}", q) for n, q in root.named_parameters())
                               if id(p) not in owners and tuple(p.shape) in shapes})
        message = (f"{type(event.optimizer).__name__} updates {len(stale)} tensor(s) of shape(s) "
                   f"{', '.join(str(list(s)) for s in shapes[:4])} that are not part of the trained model "
                   "and get no gradient")
        if replacements:
            message += f"; the model's {', '.join(replacements[:3])} (same shape) is not in any optimizer — it was replaced by assignment"
        self.report(message + ".", location=event.location,
                    evidence={"stale_shapes": [list(s) for s in shapes], "replacements": replacements},
                    step=event.step)


@register
class UnusedParameters(Check):
    """
    ## What it does
    Records which trainable parameters of a trained model (``requires_grad=True`` and in an
    optimizer) hold a gradient at sampled optimizer steps; at the end of the run, reports
    those that never did over at least three sampled steps, when others did (no gradient on
    any parameter at any step is another problem: O102, O103).

    ## Why is this bad?
    A layer defined but never called in ``forward`` (or whose output is discarded) wastes
    memory and optimizer time, and usually means the forward is not the one intended:
    a skip connection never added, a head computed but not returned. Under
    DistributedDataParallel it also forces ``find_unused_parameters=True``.

    ## Example
    ```python
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(10, 10)
            self.aux = nn.Linear(10, 10)      # never used in forward
        def forward(self, x):
            return self.body(x)
    ```

    ## Use instead
    Use the layer in ``forward``, or delete it (or freeze it with
    ``requires_grad_(False)`` if it is kept for later).

    ## References
    - PyTorch DDP docs on ``find_unused_parameters``: https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
    """

    code = "M105"
    name = "unused-parameters"
    severity = Severity.WARNING
    summary = "trainable parameters that never receive a gradient"
    fix = "use the layer in forward(), delete it, or freeze it with requires_grad_(False)"
    heuristic = True
    MIN_SAMPLED_STEPS = 3

    def __init__(self, session) -> None:
        super().__init__(session)
        self._used: set[int] = set()
        self._sampled_steps = 0
        self._location: Location | None = None

    @sampled_only
    def on_step_start(self, event: StepStart) -> None:
        if not event.sampled:
            return
        self._sampled_steps += 1
        if self._location is None:
            self._location = event.location
        for p in optimizer_params(event.optimizer):
            if p.grad is not None:
                self._used.add(id(p))

    def on_run_end(self, event: RunEnd) -> None:
        if self._sampled_steps < self.MIN_SAMPLED_STEPS:
            return
        if not self._used:
            # No parameter had a gradient at any sampled step: not unused layers but steps
            # without gradients (O103), zero_grad() between backward and step (O102), or no
            # training at all. Reporting every parameter as unused would name the wrong cause.
            return
        owners = self.session.state.optimizer_param_ids()
        unused, numel, where = [], 0, None
        for root in self.session.state.trained_roots():
            for name, p in root.named_parameters():
                if p.requires_grad and id(p) in owners and id(p) not in self._used:
                    unused.append(f"{type(root).__name__}.{name}")
                    numel += p.numel()
                    if where is None:
                        where = attribute_definition(root, name)
        if unused:
            self.report(
                f"{len(unused)} trainable parameter tensor(s) ({numel:,} values) never received a gradient "
                f"in {self._sampled_steps} sampled optimizer steps, e.g. {', '.join(unused[:3])}.",
                location=where or self._location,
                evidence={"parameters": unused, "numel": numel, "sampled_steps": self._sampled_steps},
                step=event.step,
            )


@register
class ModelNotUpdating(Check):
    """
    ## What it does
    Watches every ``optimizer.step()`` for whether it changed the parameters, in two ways:

    - **every step, for free**: the version counters of a spread sample of 16 parameters
      that hold a gradient (torch bumps a tensor's ``_version`` on every in-place write, and
      every torch optimizer writes each parameter that has a gradient; reading the counter
      touches no tensor data and never synchronises a device), and the learning rates. A
      step that wrote none of them (for an optimizer whose steps were seen to write before:
      fused optimizers write without bumping versions and are left to the next test), or
      ran with every learning rate at 0, certainly changed nothing. ``10`` such steps in a
      row are reported. Once 64 steps in a row have written the parameters this runs on
      sampled steps only, and on every step again when the loop changes (a step without
      ``backward()``, another model trained) or a sampled step finds one that wrote nothing:
      a learning rate set to 0 late in a run is reported within a sampled interval and 10
      steps.
    - **on sampled steps**: a spread sample of the parameters' values just before and just
      after the step; ``5`` consecutive sampled steps without any change are reported
      (this also catches all-zero gradients, where the write happens but changes nothing).

    Loops without an optimizer (``p -= lr * p.grad`` under ``no_grad``) are watched at their
    step boundary, the hand-written update (recognised at the next forward of the model):
    ``5`` consecutive sampled updates that wrote the parameters (their version counters
    moved) without changing any sampled value are reported. A ``p.data`` write keeps the
    version, so an update through ``.data`` that changes nothing cannot be told from no
    update at all, and is not reported.

    ## Why is this bad?
    The loop runs, the loss prints, nothing trains: learning rate 0 (a scheduler or a
    warm-up bug), gradients that are all zero (a detached graph, ``loss`` computed on
    ``.data``), or ``step()`` on an optimizer whose parameters are not the model's.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    ```

    ## Use instead
    A non-zero learning rate and a loss connected to the model's parameters; check
    ``[g["lr"] for g in optimizer.param_groups]`` and the gradient norms.

    The thresholds tolerate a warm-up that starts at ``lr=0`` for a few steps. GradScaler
    steps skipped for inf/NaN never reach ``optimizer.step()`` and are not counted. A
    closure-based optimizer (L-BFGS) that moved the parameters before and then stops has
    met its own stopping tolerances (``tolerance_grad``, ``tolerance_change``): converged,
    not reported.

    ## References
    - Karpathy, "A Recipe for Training Neural Networks" (verify the loss moves the weights):
      https://karpathy.github.io/2019/04/25/recipe/
    - PyTorch docs, ``torch.optim.LBFGS`` (``tolerance_grad``): https://pytorch.org/docs/stable/generated/torch.optim.LBFGS.html
    """

    code = "M106"
    name = "model-not-updating"
    severity = Severity.ERROR
    summary = "optimizer steps run but no trainable parameter changes (lr 0, zero gradients, wrong target)"
    fix = "check the learning rate and that the loss is computed from the model's outputs with gradients"
    heuristic = True
    CONSECUTIVE = 5  # sampled steps whose values did not change
    CONSECUTIVE_EVERY_STEP = 10  # steps that certainly wrote nothing (versions / lr 0)
    # Steps in a row that wrote the parameters, after which the every-step test runs on sampled
    # steps only; a sampled step that finds one writing nothing (a learning rate scheduled to 0)
    # brings it back to every step, to count the CONSECUTIVE_EVERY_STEP.
    SETTLE_STEPS = 64

    def __init__(self, session) -> None:
        super().__init__(session)
        self._before: dict[int, list[tuple[weakref.ref, torch.Tensor]]] = {}
        self._versions_before: dict[int, list[tuple[weakref.ref, int]] | None] = {}
        self._watched: dict[int, tuple[int, list[weakref.ref]]] = {}
        self._writes_bump_versions: set[int] = set()
        self._ever_changed: set[int] = set()
        self._unchanged: dict[int, int] = {}
        self._untouched: dict[int, int] = {}
        self._reported: set[int] = set()
        self._owners: dict[int, weakref.ref] = {}
        # The optimizer of the last step and its key: the usual step asks one weak reference.
        self._last_owner: Any = _gone
        self._last_key = 0
        # Hand-written update loops, per model (by id): a sample of (param, version, values)
        # taken at the last sampled update, and how many updates in a row changed nothing.
        self._manual_before: dict[int, tuple[weakref.ref, list[tuple[weakref.ref, int, torch.Tensor]]]] = {}
        self._manual_unchanged: dict[int, int] = {}
        self._writing = 0  # steps in a row that wrote their parameters (any optimizer)
        session.state.on_loop_change.append(self._loop_changed)

    def _loop_changed(self) -> None:
        """A step without backward() or a new model trained: judge every step again."""
        if self._writing >= self.SETTLE_STEPS:
            self._writing = 0
            self.session.every_step(self, True, "step_start", "step_end")

    def on_manual_step(self, event: ManualStep) -> None:
        module = event.module
        key = id(module)
        if key in self._reported:
            return
        previous = self._manual_before.pop(key, None)
        if previous is not None and previous[0]() is module:
            verdict = manual_update_changed(previous[1])
            if verdict is not None:
                count = 0 if verdict else self._manual_unchanged.get(key, 0) + 1
                self._manual_unchanged[key] = count
                if count >= self.CONSECUTIVE:
                    self._report_manual(event, count)
                    return
        if not event.sampled:
            return
        params = [p for p in module.parameters() if p.requires_grad and p.numel()]
        if params:
            self._manual_before[key] = (weakref.ref(module), [
                (weakref.ref(p), p._version, value_slice(p)) for p in spread_sample(params)])

    def _report_manual(self, event: ManualStep, count: int) -> None:
        module = event.module
        self._reported.add(id(module))
        name = type(module).__name__
        # The gradients the update applied may be cleared by now (zero_grad before this forward):
        # the cause is named as the two possibilities, not measured.
        self.report(
            f"The hand-written update of {name}'s parameters (no torch optimizer) ran {count} sampled "
            "times in a row, writing them (their version counters moved) without changing any sampled "
            "value: its learning rate is 0, or the gradients it applied were zero.",
            location=event.location,
            evidence={"consecutive_unchanged_steps": count, "counted": "manual updates", "update": "manual"},
            step=event.step,
        )

    def _key(self, optimizer) -> int:
        """id(optimizer), with every record forgotten when a new optimizer reuses a finished
        one's id (layer-wise phases): its parameters are not the old one's."""
        key = id(optimizer)
        owner = self._owners.get(key)
        if owner is None or owner() is not optimizer:
            for table in (self._before, self._versions_before, self._watched, self._unchanged, self._untouched):
                table.pop(key, None)
            for seen in (self._writes_bump_versions, self._ever_changed, self._reported):
                seen.discard(key)
            self._owners[key] = weakref.ref(optimizer)
        self._last_owner, self._last_key = self._owners[key], key
        return key

    def on_step_start(self, event: StepStart) -> None:
        optimizer = event.optimizer
        key = self._last_key if self._last_owner() is optimizer else self._key(optimizer)
        if key in self._reported:
            return
        if not event.has_closure:
            self._versions_before[key] = self._versions_with_grads(optimizer, key)
        if not event.sampled:
            return
        params = [p for p in optimizer_params(event.optimizer) if p.requires_grad and p.numel()]
        self._before[key] = [(weakref.ref(p), value_slice(p)) for p in spread_sample(params)]

    def on_step_end(self, event: StepEnd) -> None:
        optimizer = event.optimizer
        key = self._last_key if self._last_owner() is optimizer else self._key(optimizer)
        if key in self._reported:
            return
        if key in self._versions_before:
            self._every_step(event, key, self._versions_before.pop(key))
        if key not in self._before:
            return  # the usual step: no values taken (not sampled)
        before = self._before.pop(key)
        if not before or key in self._reported:
            return
        changed = False
        for ref, old in before:
            p = ref()
            if p is not None and not torch.equal(value_slice(p), old):
                changed = True
                break
        if changed:
            self._ever_changed.add(key)
        elif event.has_closure and key in self._ever_changed:
            return  # L-BFGS moved before and met its own stopping tolerance: converged
        self._unchanged[key] = 0 if changed else self._unchanged.get(key, 0) + 1
        if self._unchanged[key] >= self.CONSECUTIVE:
            self._report(event, self._unchanged[key], "sampled steps")

    def _versions_with_grads(self, optimizer, key: int) -> list[tuple[weakref.ref, int]] | None:
        """Version counters of the watched parameters that hold a gradient now: every torch
        optimizer writes each parameter that has one (``p.add_`` and friends move the counter):
        one written parameter is proof enough, so a spread sample of 4 (first, last and two
        between) keeps this at a microsecond or two a step whatever the model's size."""
        groups = optimizer.param_groups
        count = len(groups[0]["params"]) if len(groups) == 1 else sum(len(g["params"]) for g in groups)
        watched = self._watched.get(key)
        if watched is None or watched[0] != count:
            params = [p for p in optimizer_params(optimizer) if p.numel()]
            watched = self._watched[key] = (count, [weakref.ref(p) for p in spread_sample(params, 4)])
        found = [(ref, p._version) for ref in watched[1] if (p := ref()) is not None and p.grad is not None]
        if not found and not has_any_grad(optimizer):
            return None  # no parameter has a gradient: the step will write nothing
        return found

    def _every_step(self, event: StepEnd, key: int, versions_before: list[tuple[weakref.ref, int]] | None) -> None:
        if versions_before is None:
            untouched = True  # torch optimizers skip parameters without a gradient
        elif versions_before:
            wrote = False  # a loop, not any() over a generator: no calls on every step
            for ref, version in versions_before:
                if (p := ref()) is not None and p._version != version:
                    wrote = True
                    break
            if wrote and key not in self._writes_bump_versions:
                self._writes_bump_versions.add(key)
            untouched = not wrote and key in self._writes_bump_versions
        else:
            untouched = False  # only unwatched parameters had gradients: not known here
        groups = event.optimizer.param_groups
        if not untouched and groups:  # all_learning_rates_zero's usual case inlined (every step)
            lr = groups[0]["lr"] if "lr" in groups[0] else None
            if type(lr) is float and lr:  # a non-zero float lr: the step wrote the parameters
                self._untouched[key] = 0
                self._wrote(event)
                return
        certain = untouched or all_learning_rates_zero(event.optimizer)
        if not certain:  # the usual step: it wrote the parameters
            self._untouched[key] = 0
            self._wrote(event)
            return
        self._writing = 0
        self.session.every_step(self, True, "step_start", "step_end")  # count the steps that follow
        count = self._untouched[key] = self._untouched.get(key, 0) + 1
        if count >= self.CONSECUTIVE_EVERY_STEP:
            self._report(event, count, "steps")

    def _wrote(self, event: StepEnd) -> None:
        self._writing += 1
        if self._writing >= self.SETTLE_STEPS and not event.sampled:
            self.session.every_step(self, False, "step_start", "step_end")

    def _report(self, event: StepEnd, count: int, unit: str) -> None:
        key = id(event.optimizer)
        self._reported.add(key)
        lrs = learning_rates(event.optimizer)
        with torch.no_grad():
            grads = [p.grad for p in optimizer_params(event.optimizer) if p.grad is not None]
            grad_norm = float(torch.linalg.vector_norm(torch.stack(
                [torch.linalg.vector_norm(g.float()) for g in grads]))) if grads else 0.0
        cause = "the learning rate is 0" if all(lr == 0 for lr in lrs) else (
            "all gradients are zero or missing" if grad_norm == 0 else "the update rounds to nothing")
        self.report(
            f"{type(event.optimizer).__name__}.step() ran {count} {unit} in a row "
            f"without changing any parameter: {cause} (lr={lrs[:4]}, grad norm={grad_norm:.3g}).",
            location=event.location,
            evidence={"consecutive_unchanged_steps": count, "counted": unit, "lr": lrs,
                      "grad_norm": grad_norm},
            step=event.step,
        )


def _gone() -> None:
    """A weak reference whose object is gone (no optimizer stepped yet)."""
    return None


def manual_update_changed(before: list[tuple[weakref.ref, int, torch.Tensor]]) -> bool | None:
    """Did a hand-written update change the sampled parameters? True when some value moved,
    False when some version moved but no value did (written, unchanged), None when nothing
    was written in place (no update, or a ``p.data`` write: not known)."""
    wrote = False
    for ref, version, values in before:
        p = ref()
        if p is None:
            continue
        if not torch.equal(value_slice(p), values):
            return True
        wrote = wrote or p._version != version
    return False if wrote else None


def all_learning_rates_zero(optimizer) -> bool:
    """Every param group's lr is the Python number 0 (tensor lrs are not read: that would
    synchronise the device on every step)."""
    groups = optimizer.param_groups
    first = groups[0].get("lr") if groups else None
    if type(first) is float and first:
        return False  # the usual optimizer: a non-zero float lr in its first group
    return bool(groups) and all(
        isinstance(g.get("lr"), (int, float)) and g["lr"] == 0 for g in groups)
