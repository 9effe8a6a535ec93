"""What an unsampled step costs, checked as mechanism (no timing): which handlers run, which
events are built. The measured cost per step is in benchmarks/short_step_overhead.py."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections import Counter

import torch
import torch.nn as nn

from nndoctor.core import events as ev
from nndoctor.core.engine import Session
from nndoctor.core.events import Forward, StepEnd
from nndoctor.core.registry import all_checks
from nndoctor.core.subscribers import (
    LOSS_FORWARD,
    TRAINING_FORWARD,
    handler_names,
    is_model_forwards_only,
    is_sampled_only,
    model_forwards_only,
    sampled_only,
    sampled_training_forwards,
)
from nndoctor.instrument.extensions import install
from nndoctor.run.end import finish
from nndoctor.run.history import HistoryRecorder


def _returns_when_unsampled(test: ast.expr) -> bool:
    """``not event.sampled``, ``not (event.sampled and …)``, or an ``or`` holding one of them."""
    def names_sampled(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "sampled"
                and isinstance(node.value, ast.Name) and node.value.id == "event")

    def unsampled(node: ast.expr) -> bool:
        if not (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
            return False
        inner = node.operand
        if names_sampled(inner):
            return True
        return (isinstance(inner, ast.BoolOp) and isinstance(inner.op, ast.And)
                and any(names_sampled(v) for v in inner.values))

    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return any(unsampled(v) for v in test.values)
    return unsampled(test)


def _returns_for_loss_modules(test: ast.expr) -> bool:
    """``event.is_loss``, or an ``or`` holding it."""
    def is_loss(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "is_loss"
                and isinstance(node.value, ast.Name) and node.value.id == "event")

    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return any(is_loss(v) for v in test.values)
    return is_loss(test)


def _starts_with_unsampled_return(function) -> bool:
    """The handler's first statement (after reads of the event's attributes into locals) is
    ``if <unsampled …>: return``: skipping it on unsampled steps changes nothing."""
    return _starts_with_return_when(function, _returns_when_unsampled)


def _starts_with_return_when(function, condition) -> bool:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # docstring
    while body and isinstance(body[0], ast.Assign) and isinstance(body[0].value, ast.Attribute) \
            and isinstance(body[0].value.value, ast.Name) and body[0].value.value.id == "event":
        body = body[1:]
    if not body or not isinstance(body[0], ast.If):
        return False
    first = body[0]
    returns = len(first.body) == 1 and isinstance(first.body[0], ast.Return) and first.body[0].value is None
    return returns and condition(first.test)


def _subscriber_classes() -> list[type]:
    return [*all_checks(), HistoryRecorder]


def test_every_sampled_only_handler_returns_at_once_on_unsampled_steps():
    marked = []
    for cls in _subscriber_classes():
        for method in handler_names(cls).values():
            function = getattr(cls, method)
            if is_sampled_only(function):
                marked.append(f"{cls.__name__}.{method}")
                assert _starts_with_unsampled_return(function), (
                    f"{cls.__name__}.{method} is marked sampled_only but does not begin with "
                    "`if not event.sampled …: return`: the mark would change what it sees")
    assert len(marked) >= 25  # the checks' hot-path handlers are marked


def test_every_handler_that_returns_on_unsampled_steps_is_marked():
    """A new check whose handler ignores unsampled steps gets the fast path too."""
    missing = [f"{cls.__name__}.{method}"
               for cls in _subscriber_classes() for kind, method in handler_names(cls).items()
               if kind != "module_output"  # only ever emitted on sampled steps
               and _starts_with_unsampled_return(getattr(cls, method))
               and not is_sampled_only(getattr(cls, method))]
    assert missing == []


def test_model_forwards_only_handlers_return_at_once_for_a_loss_module_and_all_are_marked():
    marked, missing = [], []
    for cls in _subscriber_classes():
        function = getattr(cls, "on_forward", None)
        if function is None:
            continue
        starts = _starts_with_return_when(function, _returns_for_loss_modules)
        if is_model_forwards_only(function):
            marked.append(cls.__name__)
            assert starts, f"{cls.__name__}.on_forward is marked model_forwards_only but does not return on event.is_loss first"
        elif starts:
            missing.append(cls.__name__)
    assert missing == [] and len(marked) >= 10


def test_a_loss_module_forward_reaches_only_the_handlers_that_want_it():
    session = Session(checks=[])
    calls: Counter[str] = Counter()

    class Both:
        subscriber_name = "both"

        def on_forward(self, event: Forward) -> None:
            calls[f"both loss={event.is_loss}"] += 1

    class ModelOnly:
        subscriber_name = "model only"

        @model_forwards_only
        def on_forward(self, event: Forward) -> None:
            if event.is_loss:
                return
            calls[f"model loss={event.is_loss}"] += 1

    session.subscribe(Both())
    session.subscribe(ModelOnly())
    session.emit(Forward(sampled=False, is_loss=False))
    session.emit(Forward(sampled=False, is_loss=True), LOSS_FORWARD)
    assert calls == {"both loss=False": 1, "model loss=False": 1, "both loss=True": 1}


class _Recorder:
    subscriber_name = "recorder"

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    @sampled_only
    def on_forward(self, event: Forward) -> None:
        if not event.sampled:
            return
        self.calls[f"forward sampled={event.sampled}"] += 1

    def on_step_end(self, event: StepEnd) -> None:
        self.calls[f"step_end sampled={event.sampled}"] += 1


def test_dispatch_skips_sampled_only_handlers_on_unsampled_events():
    session = Session(checks=[])
    recorder = _Recorder()
    session.subscribe(recorder)
    for sampled in (True, False, False):
        session.emit(Forward(sampled=sampled))
        session.emit(StepEnd(sampled=sampled))
    assert recorder.calls == {"forward sampled=True": 1, "step_end sampled=True": 1,
                              "step_end sampled=False": 2}
    assert session.wants("forward") and session.wants_now("forward", True)
    assert not session.wants_now("forward", False)
    assert session.wants_now("step_end", False)


def test_unsampled_steps_build_no_event_that_no_handler_wants(monkeypatch):
    """With only sampled-only handlers for ``forward`` and ``loss``, the hooks build those
    events on sampled steps alone: the window, then one step in ``sample_every``."""
    built: Counter[tuple[str, bool]] = Counter()

    def counting(cls):
        class Counted(cls):
            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, **kwargs)
                built[(cls.kind, self.sampled)] += 1
        Counted.__name__ = cls.__name__
        return Counted

    for name in ("Forward", "LossComputed", "Backward", "StepStart"):
        monkeypatch.setattr(ev, name, counting(getattr(ev, name)))

    class SampledOnly:
        subscriber_name = "sampled only"
        seen = 0

        @sampled_only
        def on_forward(self, event):
            if not event.sampled:
                return
            SampledOnly.seen += 1

        @sampled_only
        def on_loss(self, event):
            if not event.sampled:
                return

    session = Session(checks=[], full_window=4, sample_every=10)
    session.subscribe(SampledOnly())
    installation = install(session)
    try:
        _train_small_mlp(40, lambda params: torch.optim.SGD(params, lr=0.1))
    finally:
        finish(session, installation, "completed", None)
    sampled_steps = sum(1 for step in range(40) if session.is_sampled(step))
    assert sampled_steps == 4 + 3  # steps 0–3, then 10, 20, 30
    # Per sampled step: the model's forward and the loss module's forward (both Forward events).
    assert built[("forward", False)] == 0 and built[("loss", False)] == 0
    assert built[("forward", True)] == 2 * sampled_steps
    assert built[("loss", True)] == sampled_steps
    assert SampledOnly.seen == 2 * sampled_steps
    # Nobody subscribed to backward or step_start: never built.
    assert built[("backward", False)] == built[("backward", True)] == 0
    assert built[("step_start", False)] == built[("step_start", True)] == 0
    assert session.step == 40 and not session.report.internal_errors


def test_a_submodule_forward_on_an_unsampled_step_leaves_the_module_stack_empty():
    """The fast path of the forward hooks (pop the top of the stack) keeps the stack exact."""
    session = Session(checks=[], full_window=1, sample_every=1000)
    installation = install(session)
    try:
        model = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.ReLU(), nn.Linear(8, 2)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
            assert installation._stack == []
    finally:
        finish(session, installation, "completed", None)


def test_every_check_on_leaves_torch_s_fast_path_to_every_module_call():
    """Module calls are observed by a wrapper of ``Module.__call__``: once the first forward
    has run, no global module hook remains (any one sends every module call of every step
    down torch's slow path), and the wrapper is gone after the run."""
    from torch.nn.modules import module as module_mod

    original_call = nn.Module.__call__
    session = Session(full_window=2, sample_every=1000)
    installation = install(session)
    try:
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
            optimizer.step()
        assert nn.Module.__call__ is not original_call
        assert not module_mod._global_forward_pre_hooks and not module_mod._global_forward_hooks
    finally:
        finish(session, installation, "completed", None)
    assert nn.Module.__call__ is original_call
    assert session.step == 4 and not session.report.internal_errors


def test_an_exception_caught_inside_a_forward_on_an_unsampled_step_keeps_the_stack_exact():
    """The wrapper's exception path pops what the failing call pushed, and records the crash
    context of the innermost module once."""
    from nndoctor.run.crash_context import crash_context

    class Fallback(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wrong, self.right = nn.Linear(3, 2), nn.Linear(4, 2)

        def forward(self, x):
            try:
                return self.wrong(x)  # shape mismatch: raises inside the submodule
            except RuntimeError:
                return self.right(x)

    session = Session(checks=[], full_window=1, sample_every=1000)
    installation = install(session)
    try:
        model = Fallback()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
            assert installation._stack == [] and installation._in_loss == 0
        record = crash_context(session)
        assert record is not None and record.context["module_qualname"] == "wrong"
        assert record.context["module_path"] == ["", "wrong"]
    finally:
        finish(session, installation, "completed", None)
    assert not session.report.internal_errors


def test_a_handler_that_unsubscribes_itself_is_not_called_again():
    class Once:
        subscriber_name = "once"
        calls = 0

        def __init__(self, session: Session) -> None:
            self.session = session

        def on_step_end(self, event: StepEnd) -> None:
            Once.calls += 1
            self.session.unsubscribe(self, "step_end")

        def on_run_end(self, event) -> None:
            pass

    class Counter_:
        subscriber_name = "counter"
        calls = 0

        def on_step_end(self, event: StepEnd) -> None:
            Counter_.calls += 1

    session = Session(checks=[])
    once = Once(session)
    session.subscribe(once)
    session.subscribe(Counter_())
    for _ in range(3):
        session.emit(StepEnd(sampled=False))
    # Unsubscribing during its own dispatch: the others of that dispatch still run.
    assert (Once.calls, Counter_.calls) == (1, 3)
    assert session.wants("run_end")  # other kinds keep their handler


def test_the_step_ledger_counts_backward_calls_on_tensors_with_values():
    """``state.backwards_with_values`` (read by O103 for a closure's steps, instead of a handler
    on every backward) counts ``Tensor.backward`` and ``torch.autograd.backward`` calls, with
    no check subscribed to backward events; meta tensors carry no values and are not counted."""
    session = Session(checks=[], full_window=1, sample_every=1000)
    installation = install(session)
    try:
        w = torch.ones(3, requires_grad=True)
        (w * 2).sum().backward()
        torch.autograd.backward((w * 3).sum())
        meta = torch.ones(3, device="meta", requires_grad=True)
        (meta * 2).sum().backward()
    finally:
        finish(session, installation, "completed", None)
    assert not session.wants("backward")
    assert session.state.backwards_with_values == 2
    assert not session.report.internal_errors


# Every-step handlers turned into sampled-step ones (session 28, issue 30): each acted only on
# sampled steps, so an unsampled step must not call it.
# Session 32: the step_start handlers that look at an optimizer's first step only (its first
# steps are always sampled: X114, O109), or at records that sampled steps fill (X109, O108).
_SAMPLED_NOW = {("O102", "on_step_start"), ("O106", "on_step_end"), ("P113", "on_step_end"),
                ("X109", "on_backward"), ("X109", "on_backward_done"), ("O108", "on_loss"),
                ("O108", "on_backward"), ("X109", "on_step_start"), ("X114", "on_step_start"),
                ("O108", "on_step_start"), ("O109", "on_step_start"), ("D109", "on_batch")}


def test_converted_handlers_are_not_called_on_unsampled_steps():
    session = Session(full_window=2, sample_every=50)
    calls: Counter[tuple[str, str, bool]] = Counter()
    for table in (session._handlers, session._every_step):
        for handlers in table.values():
            for i, (subscriber, handler) in enumerate(handlers):
                code = getattr(subscriber, "code", "")
                if (code, handler.__name__) not in _SAMPLED_NOW:
                    continue

                def counted(event, handler=handler, code=code):
                    calls[(code, handler.__name__, event.sampled)] += 1
                    return handler(event)
                counted.__name__ = handler.__name__
                handlers[i] = (subscriber, counted)
    installation = install(session)
    try:
        _train_small_mlp(60, lambda params: torch.optim.Adam(params, lr=0.01))
    finally:
        finish(session, installation, "completed", None)
    assert not session.report.internal_errors
    assert not [key for key in calls if not key[2]]  # none on an unsampled step
    called = {(code, name) for code, name, _ in calls}
    # X109's backward handlers are reached only under DDP (no sampled DDP forward here).
    assert called >= {("O102", "on_step_start"), ("O106", "on_step_end"), ("P113", "on_step_end"),
                      ("O108", "on_loss"), ("O108", "on_backward"), ("X114", "on_step_start"),
                      ("O108", "on_step_start"), ("O109", "on_step_start"), ("X109", "on_step_start")}
    assert "backward" not in {kind for kind, handlers in session._every_step.items()
                              for subscriber, _ in handlers if getattr(subscriber, "code", "") == "O103"}


def _train_small_mlp(steps, make_optimizer):
    """A plain classification loop on one fixed batch (the session is installed by the caller)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = make_optimizer(model.parameters())
    criterion = nn.CrossEntropyLoss()
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    for _ in range(steps):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()


def test_dispatch_drops_the_users_objects_from_the_event_and_keeps_plain_fields():
    """``Session.emit`` releases the event itself (inlined): the module, inputs and output are
    gone after dispatch, the plain facts stay."""
    session = Session(checks=[])
    session.subscribe(_Recorder())
    module, x = nn.Linear(2, 2), torch.ones(1, 2)
    event = Forward(step=3, sampled=True, module=module, inputs=(x,), output=module(x), training=False)
    event.cache["stats"] = object()
    session.emit(event)
    assert (event.module, event.inputs, event.output, event.frame) == (None, None, None, None)
    assert event.cache == {} and event.training is False and event.step == 3 and event.sampled


def test_an_idle_handler_is_called_only_while_armed_and_in_its_subscription_order():
    calls: list[str] = []

    class Idle:
        subscriber_name = "idle"
        idle_handlers = ("step_end",)

        def on_step_end(self, event):
            calls.append("idle")

    class Busy:
        subscriber_name = "busy"

        def on_step_end(self, event):
            calls.append("busy")

    session = Session(checks=[])
    first, idle, last = Busy(), Idle(), Busy()
    for subscriber in (first, idle, last):
        session.subscribe(subscriber)
    session.emit(StepEnd(sampled=False))
    session.emit(StepEnd(sampled=True))
    assert calls == ["busy", "busy"] * 2  # idle: not called, on any step
    session.arm(idle, "step_end")
    session.arm(idle, "step_end")  # armed already: nothing changes
    calls.clear()
    session.emit(StepEnd(sampled=False))
    assert calls == ["busy", "idle", "busy"]  # where it was subscribed, not appended
    session.disarm(idle, "step_end")
    calls.clear()
    session.emit(StepEnd(sampled=False))
    assert calls == ["busy", "busy"]


def test_a_failed_subscriber_is_not_armed_again():
    class Broken:
        subscriber_name = "broken"
        idle_handlers = ("step_end",)
        calls = 0

        def on_step_end(self, event):
            Broken.calls += 1
            raise RuntimeError("bug in a check")

    session = Session(checks=[])
    broken = Broken()
    session.subscribe(broken)
    session.arm(broken, "step_end")
    session.emit(StepEnd(sampled=False))
    session.arm(broken, "step_end")  # e.g. from a probe's callback: ignored
    session.emit(StepEnd(sampled=False))
    assert Broken.calls == 1 and len(session.report.internal_errors) == 1


def test_a_training_forward_of_an_unsampled_step_reaches_only_handlers_that_want_it():
    """``sampled_training_forwards`` handlers get a model's training forwards (autograd on,
    ``train()`` mode) on sampled steps only; evaluation forwards reach them on every step, and
    unmarked handlers get everything."""
    session = Session(checks=[])
    calls: Counter[str] = Counter()

    class Everything:
        subscriber_name = "everything"

        @model_forwards_only
        def on_forward(self, event: Forward) -> None:
            if event.is_loss:
                return
            calls[f"everything sampled={event.sampled} training={event.training}"] += 1

    class EvaluationWatcher:
        subscriber_name = "evaluation watcher"

        @sampled_training_forwards
        @model_forwards_only
        def on_forward(self, event: Forward) -> None:
            if event.is_loss:
                return
            calls[f"watcher sampled={event.sampled} training={event.training}"] += 1

    session.subscribe(Everything())
    session.subscribe(EvaluationWatcher())
    session.emit(Forward(sampled=False, training=True, grad_enabled=True), TRAINING_FORWARD)
    session.emit(Forward(sampled=False, training=False, grad_enabled=False))
    session.emit(Forward(sampled=True, training=True, grad_enabled=True))
    assert calls == {"everything sampled=False training=True": 1, "everything sampled=False training=False": 1,
                     "everything sampled=True training=True": 1, "watcher sampled=False training=False": 1,
                     "watcher sampled=True training=True": 1}
    session.unsubscribe(session._every_step[TRAINING_FORWARD][0][0], "forward")
    assert TRAINING_FORWARD not in session._every_step  # unsubscribing "forward" drops every route


_EMIT = Session.emit


def _count_unsampled_dispatch(calls: Counter, warm: int) -> None:
    """From step ``warm`` on, count in ``calls`` each event of an unsampled step and each handler
    it reaches (restore with ``Session.emit = _EMIT``)."""
    def counting(self, event, route=None):
        if not event.sampled and self.step >= warm:
            calls[f"event {event.kind}"] += 1
            for subscriber, handler in self._every_step.get(route or event.kind, ()):
                calls[f"{getattr(subscriber, 'code', '?')}.{handler.__name__}"] += 1
        return _EMIT(self, event, route)

    Session.emit = counting  # type: ignore[method-assign]


def _handler_calls_per_unsampled_step(session: Session, steps: int, warm: int) -> tuple[Counter, int]:
    """Train the MLP patient of benchmarks/ddp_overhead.py (a DataLoader over a BatchSampler,
    Adam, cross-entropy, ``loss.item()``) under ``session``; count the handler calls and the
    events built on its unsampled steps after ``warm`` steps."""
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))
    loader = DataLoader(data, sampler=BatchSampler(RandomSampler(data), batch_size=32, drop_last=True), batch_size=None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    calls: Counter[str] = Counter()
    installation = install(session)
    try:
        _count_unsampled_dispatch(calls, warm)
        batches = iter(())
        for _ in range(steps):
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            loss.item()
    finally:
        Session.emit = _EMIT  # type: ignore[method-assign]
        finish(session, installation, "completed", None)
    assert not session.report.internal_errors
    unsampled = sum(1 for step in range(warm, steps) if not session.is_sampled(step))
    return calls, unsampled


def test_an_unsampled_training_step_calls_few_handlers_with_every_check_on():
    """The launch-bound GPU step pays every handler call of an unsampled step (issue 30):
    session 31 made 42 calls and 7 events a step on this loop, session 32 21 and 6 (the stall
    watchdog reads counters, the training forward reaches no check, checks that wait for a
    rare fact are armed by it), session 33 11 and 5 (D105 settles on a shuffled loader and
    reads device labels on sampled steps, O101 follows a fingerprint for one step only, the
    zero_grad and loss handlers that judge what every step repeats are sampled-only, D110,
    O103's closure path and P116 wait for their facts, P102 reads when steps ended from the
    run state), session 34 none at all: the training losses reach L106, L107 and N101 through
    the loss ledger the backward hook writes, P114's step times and P102's loader waits are
    written by the hooks, M106 and O103 go to sampled steps once the loop has settled (and
    come back when it changes). More means a new every-step handler:
    make it ``sampled_only``, ``sampled_training_forwards``, armed on demand or
    sent to sampled steps by ``Session.every_step`` once settled, if it can be."""
    session = Session(sample_every=10_000, sample_budget=0)
    calls, unsampled = _handler_calls_per_unsampled_step(session, steps=2_150, warm=2_050)
    per_step = {name: count / unsampled for name, count in calls.items()}
    handlers = sum(v for k, v in per_step.items() if not k.startswith("event "))
    events = sum(v for k, v in per_step.items() if k.startswith("event "))
    assert per_step.get("event forward", 0) == 0  # the training forward builds no event
    assert not [k for k in per_step if k.startswith("R104.")]
    # (a pass over the loader starts every 128 steps: its epoch_start handlers add a few calls)
    assert handlers <= 0.1 and events <= 0.1, sorted(per_step.items())


def test_the_stall_watchdog_counts_progress_without_a_handler():
    """R104's progress is the run state's counters: batches, root forwards, finished
    backward passes and optimizer steps, and the last of them, with no event built for it."""
    session = Session(select=["R104"], full_window=1, sample_every=1000)
    check = next(c for c in session.checks if c.code == "R104")
    assert not check.armed and check.last_kind == "start"
    _handler_calls_per_unsampled_step(session, steps=5, warm=0)
    assert not [kind for kind, handlers in session._handlers.items() for s, _ in handlers if s is check]
    state = session.state
    assert (state.batches_fetched, state.forwards, state.backwards_done, state.total_steps) == (5, 5, 5, 5)
    assert check.beats == 20 and check.armed and check.last_kind == "optimizer step"


def test_an_unsampled_ddp_step_calls_no_handler(monkeypatch):
    """The same under DistributedDataParallel (one gloo process, a DistributedSampler): the X
    family adds no handler call to an unsampled step — at most one at the first step of a pass
    (X107 looks at the training forwards of sampled steps: a loop's forward is the same call
    on every step). L108, still deciding on this short run, is left out."""
    import socket

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port)), ("RANK", "0"),
                        ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    session = Session(sample_every=10_000, sample_budget=0)
    installation = install(session)
    calls: Counter[str] = Counter()
    warm = 300
    dist.init_process_group("gloo")
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
        x = torch.randn(2048, 16)
        data = TensorDataset(x, (x @ torch.randn(16, 4)).argmax(1))
        sampler = DistributedSampler(data)
        loader = DataLoader(data, sampler=sampler, batch_size=32, drop_last=True)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        criterion = nn.CrossEntropyLoss()
        _count_unsampled_dispatch(calls, warm)
        for epoch in range(7):
            sampler.set_epoch(epoch)
            for inputs, labels in loader:
                optimizer.zero_grad(set_to_none=True)
                loss = criterion(model(inputs), labels)
                loss.backward()
                optimizer.step()
                loss.item()
    finally:
        Session.emit = _EMIT  # type: ignore[method-assign]
        finish(session, installation, "completed", None)
        dist.destroy_process_group()
    assert session.step == 7 * 64 and not session.report.internal_errors
    passes = (7 * 64 - warm) // 64 + 1
    ddp = {name: n for name, n in calls.items() if name.startswith("X")}  # epoch_start handlers included
    assert all(n <= passes for n in ddp.values()), sorted(calls.items())
