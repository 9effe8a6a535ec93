"""The preflight subscriber: captures the model, a copy of the first batch and how the loss is
computed during the first training step, then — at the first ``optimizer.step()`` — runs the
active tests on copies, with every hook quiet and the user's random number generators saved
and restored, and either stops the run (``nndoctor preflight``) or lets it train on unchanged.
"""

from __future__ import annotations

import inspect
import math
import os
import random
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from nndoctor.commands.preflight import active
from nndoctor.commands.preflight.checks import BatchMixing, CannotOverfitOneBatch, GradcheckFailed
from nndoctor.core.engine import StopRun
from nndoctor.core.findings import Location
from nndoctor.core.registry import get_check

OVERFIT_BUDGET_S = float(os.environ.get("NNDOCTOR_PREFLIGHT_BUDGET", "20"))
_MAX_CAPTURES = 4
_MAX_STEP_ATTEMPTS = 3


class _Capture:
    """One training forward before the first step: the model (weakly), copies of its inputs."""

    def __init__(self, event: Any) -> None:
        import torch

        self.model_ref = weakref.ref(event.module)
        self.inputs = active.clone_batch(tuple(event.inputs))
        self.kwargs = active.clone_batch(dict(event.kwargs or {}))
        # model(**batch) when the forward hook does not see keyword arguments: nothing to replay.
        self.replayable = bool(self.inputs or self.kwargs)
        self.location = event.location
        output = event.output
        self.output_ref = weakref.ref(output) if isinstance(output, torch.Tensor) else None
        own_loss = getattr(output, "loss", None)
        if own_loss is None and isinstance(output, dict):
            own_loss = output.get("loss")
        self.own_loss_ref = weakref.ref(own_loss) if isinstance(own_loss, torch.Tensor) else None
        self.loss_of_output: Callable[[Any], Any] | None = None
        self.loss_description = ""
        self.target = None
        self.loss_location: Location | None = None
        self.skip_reason: str | None = None


class PreflightProbe:
    """Internal subscriber of a preflight session (an event subscriber, not a catalog check)."""

    subscriber_name = "preflight probe"

    def __init__(self, session: Any, *, stop: bool = False, budget_s: float = OVERFIT_BUDGET_S) -> None:
        self.session = session
        self.stop_after = stop
        self.budget_s = budget_s
        self.captures: list[_Capture] = []
        self.done = False
        self._attempts = 0

    # -- capture ---------------------------------------------------------------------------
    def on_forward(self, event: Any) -> None:
        if self.done or event.is_loss or not event.grad_enabled or not event.training:
            return
        if len(self.captures) < _MAX_CAPTURES:
            self.captures.append(_Capture(event))

    def on_loss(self, event: Any) -> None:
        if self.done:
            return
        for capture in self.captures:
            output = capture.output_ref() if capture.output_ref else None
            if output is None or capture.loss_of_output is not None:
                continue
            reshape = None
            if event.input is output:
                pass
            elif (getattr(event.input, "_base", None) is output or getattr(output, "_base", None) is not None
                  and getattr(event.input, "_base", None) is output._base) and event.input.numel() == output.numel():
                reshape = tuple(event.input.shape)  # logits.view(-1, vocab) before the loss
            else:
                capture.skip_reason = (f"the loss ({event.function}) receives a transformed model output; preflight "
                                       "replays loss(model(x), y), a reshape of the output, or a model that returns its own loss")
                continue
            capture.target = active.clone_batch(event.target)
            capture.loss_of_output = _loss_function(event, capture.target, reshape)
            capture.loss_description = f"{event.function}(model output{' reshaped to ' + str(list(reshape)) if reshape else ''}, target)"
            capture.loss_location = event.location
            return

    def on_backward(self, event: Any) -> None:
        if self.done:
            return
        for capture in self.captures:
            if capture.own_loss_ref is not None and capture.own_loss_ref() is event.tensor:
                capture.loss_of_output = _own_loss
                capture.loss_description = "the loss the model returns (output.loss)"
                capture.loss_location = event.location

    # -- the tests -------------------------------------------------------------------------
    def on_step_start(self, event: Any) -> None:
        if self.done:
            return
        self._attempts += 1
        if self._capture_for(event.optimizer) is None and self._attempts < _MAX_STEP_ATTEMPTS:
            # A closure optimizer (L-BFGS) calls the model inside step(): the forward comes later.
            return
        self.done = True
        session = self.session
        active_before, session.active = session.active, False
        try:
            results = self._run(event.optimizer)
        finally:
            session.active = active_before
            self.captures = []
        session.report.extra["preflight"] = results
        if self.stop_after:
            raise StopRun("preflight finished")

    def on_run_end(self, event: Any) -> None:
        if not self.done:
            self.done = True
            self.session.report.extra["preflight"] = {
                "ran": False, "reason": "no optimizer step was observed, so there was no model, batch and loss to test",
                "tests": []}

    def _run(self, optimizer: Any) -> dict[str, Any]:
        capture = self._capture_for(optimizer)
        if capture is None:
            return {"ran": False, "reason": "no training forward of a model updated by this optimizer was seen",
                    "tests": []}
        model = capture.model_ref()
        if not capture.replayable:
            return {"ran": False, "tests": [],
                    "reason": f"{type(model).__name__} was called with keyword arguments only, which nndoctor's "
                              "forward hook does not see: the batch cannot be replayed on a copy"}
        recipe = active.StepRecipe(model=model, optimizer=optimizer, inputs=capture.inputs, kwargs=capture.kwargs,
                                   loss_of_output=capture.loss_of_output, loss_description=capture.loss_description,
                                   target=capture.target, location=capture.loss_location or capture.location,
                                   skip_reason=capture.skip_reason or (
                                       None if capture.loss_of_output else
                                       "no loss function was seen applied to the model's output (a hand-written or "
                                       "combined loss); preflight replays loss(model(x), y) or a model that returns its loss"))
        estimate = active.estimate_copy_bytes(model)
        device = active.model_device(model)
        free = active.available_bytes(device)
        tests: list[active.TestResult] = []
        started = time.perf_counter()
        with _rng_preserved():
            tests.append(active.first_batch_sanity(recipe))
            if free is not None and estimate > 0.8 * free:
                reason = (f"a copy of the model with gradients and optimizer state needs about {estimate / 2**30:.1f} GiB, "
                          f"{free / 2**30:.1f} GiB is free on {device}: run preflight on the CPU "
                          "(CUDA_VISIBLE_DEVICES='') or with a smaller model/batch")
                for name in ("batch independence (M107)", "overfit one batch (H101)",
                             "gradcheck of custom autograd Functions (H102)"):
                    tests.append(active.TestResult(name, "skipped", detail=reason))
            else:
                tests.append(self._guarded("batch independence (M107)", lambda: active.batch_independence(recipe)))
                overfit = self._guarded("overfit one batch (H101)",
                                        lambda: active.overfit_one_batch(recipe, self.budget_s), pair=True)
                overfit_result, initial_loss = overfit
                tests.append(overfit_result)
                gradcheck = self._guarded("gradcheck of custom autograd Functions (H102)",
                                          lambda: active.check_custom_functions(recipe), pair=True)
                tests.append(gradcheck[0])
                self._report(tests, recipe, capture, initial_loss, gradcheck[1] or [])
        return {"ran": True, "seconds": round(time.perf_counter() - started, 3),
                "model": type(model).__name__, "copy_bytes_estimate": estimate,
                "loss": recipe.loss_description or None, "tests": [t.to_json() for t in tests]}

    def _capture_for(self, optimizer: Any) -> _Capture | None:
        inner = active.unwrap_optimizer(optimizer)
        owned = {id(p) for group in inner.param_groups for p in group["params"]}
        for capture in self.captures:
            model = capture.model_ref()
            if model is not None and any(id(p) in owned for p in model.parameters()):
                return capture
        return None

    def _guarded(self, name: str, test: Any, pair: bool = False) -> Any:
        try:
            return test()
        except Exception as error:  # noqa: BLE001 - a test that breaks is reported, never raised
            if _raised_by_nndoctor(error):
                self.session.internal_error(f"preflight {name}", error)
            # Otherwise the model or torch refused the test (reentrant checkpointing and
            # autograd.grad, a forward that needs state the copy lacks): skipped, with why.
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            result = active.TestResult(name, "skipped",
                                       detail=f"the test could not run on this model: {type(error).__name__}: {first_line}")
            return (result, None) if pair else result

    def _report(self, tests: list[active.TestResult], recipe: active.StepRecipe, capture: _Capture,
                initial_loss: float | None, failures: list[dict[str, Any]]) -> None:
        session = self.session
        by_name = {t.name: t for t in tests}
        mixing = by_name.get("batch independence (M107)")
        if mixing and mixing.status == "failed":
            session.add_finding(BatchMixing.finding(
                f"{type(recipe.model).__name__} mixes samples: {mixing.detail}.", location=capture.location,
                evidence=mixing.evidence))
        overfit = by_name.get("overfit one batch (H101)")
        if overfit and overfit.status == "failed":
            session.add_finding(CannotOverfitOneBatch.finding(
                f"A copy of {type(recipe.model).__name__} trained on the first batch alone did not drive "
                f"{recipe.loss_description or 'the loss'} down: {overfit.detail}.", location=recipe.location,
                evidence=overfit.evidence))
        for failure in failures:
            session.add_finding(GradcheckFailed.finding(
                f"The backward of {failure['function']} disagrees with finite differences: relative error "
                f"{failure['relative_error']:.3g} along random directions, on float64 copies of its inputs "
                f"{failure['input_shapes']}.", location=_function_location(failure["function"]) or capture.location,
                evidence=failure))
        self._initial_loss(tests, recipe, initial_loss)

    def _initial_loss(self, tests: list[active.TestResult], recipe: active.StepRecipe, initial: float | None) -> None:
        """L105 with the copy's first loss on the real batch, when the loss is a cross-entropy."""
        import torch

        target = recipe.target
        if (initial is None or not recipe.loss_description.startswith(("cross_entropy(", "CrossEntropyLoss("))
                or not isinstance(target, torch.Tensor)):
            return
        classes = _classes(recipe)
        if not classes or classes < 2:
            return
        from nndoctor.checks.losses import expected_excess

        ln_c = math.log(classes)
        limit = expected_excess(classes)
        status = "failed" if initial - ln_c > limit else "passed"
        tests.append(active.TestResult("loss at initialisation (L105)", status,
                                       detail=f"first loss {initial:.4g} vs ln({classes}) = {ln_c:.4g}"))
        check = get_check("L105")
        if status == "failed" and check is not None:
            self.session.add_finding(check.finding(
                f"The first loss on the real batch is {initial:.3g} for {classes} classes, while an untrained model "
                f"should give about ln({classes}) = {ln_c:.3g} (threshold {ln_c + limit:.3g}).",
                location=recipe.location, evidence={"initial_loss": initial, "classes": classes}))


def _raised_by_nndoctor(error: BaseException) -> bool:
    """Did the exception start in nndoctor's own code (a bug to report) rather than in the
    user's model or in torch?"""
    frames = traceback.extract_tb(error.__traceback__)
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(package)


def _classes(recipe: active.StepRecipe) -> int | None:
    import copy

    import torch

    model = copy.deepcopy(recipe.model)
    with torch.no_grad():
        output = active.first_tensor(model(*recipe.inputs, **recipe.kwargs))
    if output is None or output.dim() < 2:
        return None
    return int(output.shape[-1] if output.dim() > 2 else output.shape[1])


def _loss_function(event: Any, target: Any, reshape: tuple | None) -> Any:
    import copy

    import torch.nn.functional as F

    module = copy.deepcopy(event.module) if event.module is not None else None
    function = getattr(F, event.function, None) if module is None else None
    options = dict(event.options or {})
    if module is None and function is None:
        return None

    def loss_of_output(output: Any) -> Any:
        prediction = output.reshape(reshape) if reshape else output
        if module is not None:
            return module(prediction, target)
        assert function is not None  # checked above: one of the two exists
        return function(prediction, target, **options)

    return loss_of_output


def _own_loss(output: Any) -> Any:
    loss = getattr(output, "loss", None)
    return loss if loss is not None else output["loss"]


def _function_location(qualified: str) -> Location | None:
    """The ``def backward`` line of a custom Function (where the wrong derivative is written)."""
    import sys

    module_name, _, name = qualified.rpartition(".")
    owner = sys.modules.get(module_name)
    cls = getattr(owner, name.split(".")[0], None) if owner else None
    backward = getattr(cls, "backward", None)
    if backward is None:
        return None
    try:
        path = inspect.getsourcefile(backward)
        lines, first = inspect.getsourcelines(backward)
    except (TypeError, OSError):
        return None
    offset = next((i for i, text in enumerate(lines) if text.lstrip().startswith("def ")), 0)
    return Location(path, first + offset) if path else None


class _rng_preserved:
    """Save and restore every RNG the tests could draw from: torch (CPU and CUDA), random, numpy."""

    def __enter__(self):
        import torch

        self.python = random.getstate()
        self.torch = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        try:
            import numpy

            self.numpy = numpy.random.get_state()
        except ImportError:
            self.numpy = None
        return self

    def __exit__(self, *exc):
        import torch

        random.setstate(self.python)
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        if self.numpy is not None:
            import numpy

            numpy.random.set_state(self.numpy)
        return False


def attach(session: Any, *, stop: bool, budget_s: float = OVERFIT_BUDGET_S) -> None:
    """Add the preflight probe to a session (``stop``: end the run once the tests ran;
    ``budget_s``: the time the overfit test may take)."""
    session.subscribe(PreflightProbe(session, stop=stop, budget_s=budget_s))
