"""The engine: a Session owns the enabled checks, dispatches events to them, and keeps run state.

Run state lives here, on the session object, never in module globals (so two sessions in
one process, e.g. nested ``watch()`` in tests, cannot see each other's data): facts every
check shares in ``state``, a feature's own records under its typed key in ``stash``.
"""

from __future__ import annotations

import os
import time
import traceback
import weakref
from collections.abc import Iterable
from typing import Any

from nndoctor.core.events import RELEASED, Event, released_nones
from nndoctor.core.findings import Finding, InternalError, Report
from nndoctor.core.optimizers import unwrap_optimizer
from nndoctor.core.registry import Check, enabled_checks
from nndoctor.core.sample_budget import BASELINE_STEPS, SampleBudget, budget_from_env
from nndoctor.core.stash import Stash
from nndoctor.core.subscribers import (
    LOSS_FORWARD,
    TRAINING_FORWARD,
    TRAINING_LOSS,
    Subscriber,
    describe,
    handler_names,
    is_model_forwards_only,
    is_sampled_only,
    is_sampled_training_forwards,
    is_sampled_training_losses,
)

DEFAULT_FULL_WINDOW = int(os.environ.get("NNDOCTOR_FULL_WINDOW", "16"))
DEFAULT_SAMPLE_EVERY = int(os.environ.get("NNDOCTOR_SAMPLE_EVERY", "100"))
_MAX_INTERNAL_ERRORS = 20


class _ProcessId:
    """``os.getpid()`` read once per process, not once per event: refreshed in a forked child
    (DataLoader workers), where a session of the parent must stop dispatching."""

    value = os.getpid()

    @classmethod
    def refresh(cls) -> None:
        cls.value = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ProcessId.refresh)


class _Gone:
    pass


_gone: weakref.ref[Any] = weakref.ref(_Gone())  # a weak reference whose object is gone


class StopRun(BaseException):
    """Raised out of ``optimizer.step()`` when ``--max-steps`` is reached.

    A BaseException so that a user's ``except Exception`` does not swallow it.
    """


def _without(table: dict[str, list[tuple[Subscriber, Any]]], subscriber: Subscriber,
             kinds: Iterable[str] = ()) -> dict[str, list[tuple[Subscriber, Any]]]:
    """The dispatch table less one subscriber (for ``kinds`` only, if given): new lists, so a
    dispatch in progress is unaffected."""
    only = frozenset(kinds)
    kept = {kind: [(c, h) for c, h in handlers if c is not subscriber or (only and kind not in only)]
            for kind, handlers in table.items()}
    return {kind: handlers for kind, handlers in kept.items() if handlers}


def _with_routes(kinds: Iterable[str]) -> tuple[str, ...]:
    """The kinds and the routes that carry events of them to a subset of their handlers."""
    kinds = tuple(kinds)
    extra = ((LOSS_FORWARD, TRAINING_FORWARD) if "forward" in kinds else ()) + ((TRAINING_LOSS,) if "loss" in kinds else ())
    return kinds + extra


class RunState:
    """Facts about the run that several checks need, maintained by the instrumentation.

    Everything the user owns is held through weak references.
    """

    def __init__(self) -> None:
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._step_counts: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        # The count of the optimizer that stepped last, kept apart from the weak dictionary
        # (whose look-ups and stores are Python calls, a new weak reference per store): the
        # usual step counts here, and ``step_counts`` writes it back before anyone reads.
        self._counted: weakref.ref[Any] = _gone
        self._count = 0
        self.roots: weakref.WeakSet[Any] = weakref.WeakSet()
        self.mode_generation = 0
        self.backwards_since_step = 0
        # The step ledger: facts of every step that the instrumentation writes and checks read
        # when they decide, instead of each subscribing to every step's events.
        self.backwards_with_values = 0  # backward() calls on tensors with values (Backward events)
        self.zero_grads_since_backward = 0
        self.total_steps = 0  # every optimizer.step() and manual update
        self.manual_steps = 0  # updates without torch.optim, recognised by version counters
        self.batches_fetched = 0
        self.batches_at_last_backward = 0
        # Progress, for the stall watchdog (R104): the instrumentation counts root forwards and
        # finished backward passes and names the last kind of progress, with no event a step.
        self.forwards = 0
        self.backwards_done = 0
        self.data_wait_s = 0.0  # seconds the loop waited in DataLoader iterators (P114 reads it per step)
        # When optimizer steps ended (``perf_counter``), read by the timing checks instead of a
        # clock call each: the first, the latest, and how many (the hook after every step).
        self.first_step_end: float | None = None
        self.last_step_end = 0.0
        self.step_ends = 0
        self.last_progress = "start"  # "batch", "forward", "backward" or "optimizer step"
        # The loss ledger, once a check follows the losses backward() runs on: the backward
        # hook records each of them there itself (instrument/loss_ledger.py), with no event.
        self.loss_feed: Any = None
        # Called when the training loop changes in a way a check that went quiet must see at
        # once: an optimizer step with no backward() since the last one, or a model trained
        # that was not the last one (a copy swapped in). Checks that judge every step only
        # until the loop has settled (M106, O103) put their re-arming here.
        self.on_loop_change: list[Any] = []
        # When each optimizer step ended, written by the step hook while P114 times steps
        # (``nndoctor.core.step_log``): no event a step.
        self.step_log: Any = None
        self.scaler: weakref.ref[Any] | None = None
        self.loader_lengths: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()
        self._param_owner_cache: (
            tuple[tuple[weakref.ref[Any], ...], tuple[int, ...], dict[int, Any]] | None) = None

    # -- optimizer steps ------------------------------------------------------------------
    @property
    def step_counts(self) -> weakref.WeakKeyDictionary[Any, int]:
        """Each optimizer's own steps so far (a weak dictionary: read it, count with ``count``)."""
        counted = self._counted()
        if counted is not None:
            self._step_counts[counted] = self._count
        return self._step_counts

    def steps_of(self, optimizer: Any) -> int:
        """``step_counts.get(optimizer, 0)``, without a Python call for the last one to step."""
        if self._counted() is optimizer:
            return self._count
        return self.step_counts.get(optimizer, 0)

    def count(self, optimizer: Any) -> int:
        """Count a step of ``optimizer``; its steps before this one."""
        if self._counted() is optimizer:  # the usual step
            before = self._count
        else:
            before = self.step_counts.get(optimizer, 0)  # writes the last one's count back
            self._counted = weakref.ref(optimizer)
        self._count = before + 1
        return before

    # -- optimizers and the parameters they own -----------------------------------------
    def optimizer_param_ids(self) -> dict[int, Any]:
        """id(param) -> a weak reference to the optimizer that updates it."""
        live = sorted(self.optimizers, key=id)
        counts = tuple(sum(len(g["params"]) for g in opt.param_groups) for opt in live)
        cached = self._param_owner_cache
        # Valid only for the very same optimizer objects (weak references, so an id reused by a
        # new optimizer of the same size after the old one died is not mistaken for it).
        if (cached is None or cached[1] != counts or len(cached[0]) != len(live)
                or any(ref() is not opt for ref, opt in zip(cached[0], live, strict=True))):
            owners: dict[int, Any] = {}
            refs = []
            for opt in live:
                ref = weakref.ref(opt)
                refs.append(ref)
                for group in opt.param_groups:
                    for p in group["params"]:
                        owners[id(p)] = ref
            cached = self._param_owner_cache = (tuple(refs), counts, owners)
        return cached[2]

    def is_trained(self, module: Any) -> bool:
        """True when some optimizer updates at least one of the module's parameters."""
        owners = self.optimizer_param_ids()
        if not owners:
            return False
        return any(id(p) in owners for p in module.parameters())

    def trained_roots(self) -> list[Any]:
        return [m for m in list(self.roots) if self.is_trained(m)]


class Session:
    """One observed run: checks, dispatch, findings and the state they share."""

    # False: the run installs only the instrumentation that needs no PyTorch (Keras, tf.data),
    # as without torch installed, and never imports torch (a TensorFlow re-run: tf_inject.py).
    instruments_torch = True

    def __init__(
        self,
        *,
        select: Iterable[str] = (),
        ignore: Iterable[str] = (),
        command: list[str] | None = None,
        max_steps: int | None = None,
        full_window: int = DEFAULT_FULL_WINDOW,
        sample_every: int | None = None,
        sample_budget: float | None = None,
        checks: Iterable[type[Check]] | None = None,
    ) -> None:
        self.report = Report(command=list(command or []))
        # Kept for features outside the dispatch table (crash explanations honour them too).
        self.select, self.ignore = list(select), list(ignore)
        self.max_steps = max_steps
        self.full_window = full_window
        self.sample_every = max(1, DEFAULT_SAMPLE_EVERY if sample_every is None else sample_every)
        # The interval widens when sampled steps cost more than the budget's share of the run
        # (``sample_budget``), unless the user chose one (argument, configuration, environment).
        if sample_budget is None:
            chosen = sample_every is not None or "NNDOCTOR_SAMPLE_EVERY" in os.environ
            sample_budget = 0.0 if chosen else budget_from_env()
        self.sample_budget: SampleBudget | None = (
            SampleBudget(self, sample_budget) if sample_budget > 0 else None)
        self.pid = os.getpid()
        self.state = RunState()
        # Per-run records of instrumentation and features, each under its module's StashKey.
        self.stash = Stash()
        self.step = 0
        self._round: set[int] = set()
        self._phase_sampled = False
        self._plain_optimizer: weakref.ref[Any] = _gone  # the last optimizer found to be no wrapper
        self.active = False
        self.started = time.perf_counter()
        classes = list(checks) if checks is not None else enabled_checks(select, ignore)
        self.checks: list[Check] = []
        self._handlers: dict[str, list[tuple[Subscriber, Any]]] = {}
        # The same, less the handlers marked ``sampled_only``: what an unsampled step's event reaches.
        self._every_step: dict[str, list[tuple[Subscriber, Any]]] = {}
        self._order: dict[tuple[int, str], int] = {}  # (id(subscriber), route) -> subscription rank
        self._disabled: set[int] = set()  # ids of subscribers whose handler raised
        self._sampled_now: set[tuple[int, str]] = set()  # (id, kind) sent to sampled steps only (``every_step``)
        for cls in classes:
            self._add_check(cls)

    def add_checks(self, classes: Iterable[type[Check]]) -> None:
        """Enable more checks on a running session: a framework observer (Keras, tf.data) adds
        its family's enabled checks once the script imports the framework. A class already
        enabled is left as it is."""
        for cls in classes:
            if not any(type(check) is cls for check in self.checks):
                self._add_check(cls)

    def _add_check(self, cls: type[Check]) -> None:
        try:
            check = cls(self)
        except Exception as error:  # noqa: BLE001 - a broken check must not break the run
            self.internal_error(f"{cls.code} setup", error)
            return
        self.checks.append(check)
        self.subscribe(check)

    def subscribe(self, subscriber: Subscriber) -> None:
        """Dispatch events to any object with ``on_<kind>`` methods (checks, and internal
        helpers with no catalog code: the perf recorder, the preflight probe, the history).

        The kinds a subscriber lists in ``idle_handlers`` are not dispatched until it calls
        ``arm(self, kind)``: a handler that has nothing to do until another event starts
        something (a pass over a DistributedSampler) costs no call on the steps between."""
        idle = getattr(type(subscriber), "idle_handlers", ())
        for kind, method in handler_names(type(subscriber)).items():
            handler = getattr(subscriber, method)
            for route in self._routes(kind, handler):
                self._order[(id(subscriber), route)] = len(self._order)  # arm() restores this order
                if kind not in idle:
                    self._add(subscriber, handler, route)

    @staticmethod
    def _routes(kind: str, handler: Any) -> tuple[str, ...]:
        if kind == "loss":
            return (kind,) if is_sampled_training_losses(handler) else (kind, TRAINING_LOSS)
        if kind != "forward":
            return (kind,)
        routes = [kind]
        if not is_model_forwards_only(handler):
            routes.append(LOSS_FORWARD)
        if not is_sampled_training_forwards(handler):
            routes.append(TRAINING_FORWARD)
        return tuple(routes)

    def _add(self, subscriber: Subscriber, handler: Any, route: str, *, every_step_only: bool = False) -> None:
        """Add a handler to the dispatch tables in subscription order. New lists (copy on
        write): a dispatch in progress iterates the old ones."""
        order = self._order

        def position(pair: tuple[Subscriber, Any]) -> int:
            return order.get((id(pair[0]), route), len(order))

        if every_step_only:
            tables: tuple[dict[str, list[tuple[Subscriber, Any]]], ...] = (self._every_step,)
        else:
            tables = (self._handlers,) if is_sampled_only(handler) else (self._handlers, self._every_step)
        for table in tables:
            table[route] = sorted([*table.get(route, ()), (subscriber, handler)], key=position)

    def arm(self, subscriber: Subscriber, *kinds: str) -> None:
        """Dispatch these kinds (listed in the subscriber's ``idle_handlers``, or turned to
        sampled steps by ``every_step``) to it again on every step, in its subscription
        order; armed already: nothing changes."""
        if id(subscriber) in self._disabled:
            return  # failed once: never dispatched again
        for kind in kinds:
            self._sampled_now.discard((id(subscriber), kind))
            handler = getattr(subscriber, f"on_{kind}")
            for route in self._routes(kind, handler):
                if all(s is not subscriber for s, _ in self._handlers.get(route, ())):
                    self._add(subscriber, handler, route)
                elif not is_sampled_only(handler) and \
                        all(s is not subscriber for s, _ in self._every_step.get(route, ())):
                    self._add(subscriber, handler, route, every_step_only=True)

    def disarm(self, subscriber: Subscriber, *kinds: str) -> None:
        """Stop dispatching these kinds to it until ``arm`` (``unsubscribe``, re-armable)."""
        self.unsubscribe(subscriber, *kinds)

    def every_step(self, subscriber: Subscriber, wanted: bool, *kinds: str) -> None:
        """Dispatch these kinds to it on every step (``wanted``), or on sampled steps only: a
        handler with nothing to do between sampled steps for now (what would give it work
        again, it sees on a sampled step or through another event) stops costing a call on the
        others. A call that changes nothing costs a set look-up (asked per batch or step)."""
        if wanted != ((id(subscriber), kinds[0]) in self._sampled_now):
            return
        if wanted:
            self.arm(subscriber, *kinds)
        else:
            self._every_step = _without(self._every_step, subscriber, _with_routes(kinds))
            self._sampled_now.update((id(subscriber), kind) for kind in kinds)

    # -- dispatch ------------------------------------------------------------------------
    def wants(self, kind: str) -> bool:
        return kind in self._handlers

    def wants_now(self, kind: str, sampled: bool) -> bool:
        """Would an event of this kind reach a handler on a step that is (not) sampled?
        The instrumentation asks before building an event on the hot path."""
        return kind in (self._handlers if sampled else self._every_step)

    def needed_probes(self) -> frozenset[str]:
        """The probes (``nndoctor.core.probes``) that the enabled checks and listeners declare."""
        owners = [*self.checks, *(owner for handlers in self._handlers.values() for owner, _ in handlers)]
        return frozenset(name for owner in owners for name in getattr(type(owner), "needs", ()))

    @property
    def sampled(self) -> bool:
        """Is the current step fully instrumented?"""
        # is_sampled inlined: asked several times on every step (and this expression is inlined
        # in turn in ``torch_hooks``' ``Module.__call__`` wrapper: keep the two the same).
        step = self.step
        return step < self.full_window or step % self.sample_every == 0 or self._phase_sampled

    def is_sampled(self, step: int) -> bool:
        return step < self.full_window or step % self.sample_every == 0

    def emit(self, event: Event, route: str | None = None) -> None:
        """Give the event to every check that subscribed to its kind (or to ``route``, a
        subset of them: ``LOSS_FORWARD``); never raise."""
        try:  # the hooks ask before building an event: the kind is usually there (no .get call)
            handlers = (self._handlers if event.sampled else self._every_step)[route or event.kind]
        except KeyError:
            return
        if _ProcessId.value != self.pid:
            return
        try:
            # No copy: ``_disable`` replaces the lists instead of changing them.
            for subscriber, handler in handlers:
                try:
                    handler(event)
                except StopRun:
                    raise
                except Exception as error:  # noqa: BLE001 - observer rule
                    self.internal_error(f"{describe(subscriber)} on {event.kind}", error)
                    self._disable(subscriber)
        finally:
            # event.release(), inlined (every event of the hot path): drop the user's objects
            event.frame = None
            if event.cache:
                event.cache.clear()
            try:
                nones = RELEASED[type(event)]
            except KeyError:
                nones = released_nones(type(event))
            event.__dict__.update(nones)

    def unsubscribe(self, subscriber: Subscriber, *kinds: str) -> None:
        """Stop dispatching these kinds to ``subscriber``: a check whose handler has nothing
        left to do (decided, reported once) stops costing a call on every step. Safe during
        dispatch: the tables are replaced, not changed."""
        routes = _with_routes(kinds)
        self._handlers = _without(self._handlers, subscriber, routes)
        self._every_step = _without(self._every_step, subscriber, routes)

    def _disable(self, subscriber: Subscriber) -> None:
        self._disabled.add(id(subscriber))
        self._handlers = _without(self._handlers, subscriber)
        self._every_step = _without(self._every_step, subscriber)

    # -- findings and errors -------------------------------------------------------------
    def add_finding(self, finding: Finding) -> Finding:
        if finding.first_step is None:
            finding.first_step = self.step
        return self.report.add(finding)

    def internal_error(self, where: str, error: BaseException) -> None:
        if len(self.report.internal_errors) >= _MAX_INTERNAL_ERRORS:
            return
        self.report.internal_errors.append(
            InternalError(
                where=where,
                error=f"{type(error).__name__}: {error}",
                traceback="".join(traceback.format_exception(type(error), error, error.__traceback__)),
            )
        )

    # -- steps -----------------------------------------------------------------------------
    # ``step`` counts training iterations: one per round in which each optimizer steps at most
    # once (a GAN's D and G steps are one iteration; layer-wise training's phases follow one
    # another, so a second optimizer's steps keep counting, are sampled and meet --max-steps).
    # Each optimizer's own count is in ``state.step_counts``; ``state.total_steps`` counts
    # every update, manual ones included.
    def count_step(self, optimizer: Any) -> None:
        optimizer = unwrap_optimizer(optimizer)
        own = self.state.count(optimizer) + 1
        self._count_round(id(optimizer))
        # The first steps of a new optimizer (the next phase) are fully observed, like the run's.
        self._phase_sampled = own < self.full_window

    def end_step(self, optimizer: Any) -> bool:
        """``step_sampled`` then ``count_step`` for the step of ``optimizer`` that just ran, with
        one unwrap and one look-up (the hook after every ``optimizer.step()``): was it sampled?"""
        if self._plain_optimizer() is not optimizer:  # the usual step: a torch optimizer, no wrapper
            optimizer = self._unwrap(optimizer)
        before = self.state.count(optimizer)
        own = before + 1
        step = self.step  # is_sampled(step) inlined, here and in step_sampled: every step
        sampled = step < self.full_window or step % self.sample_every == 0 or before < self.full_window
        self._count_round(id(optimizer))
        self._phase_sampled = own < self.full_window
        budget = self.sample_budget
        if budget is not None:
            every = self.sample_every  # step_ended's own first test, inlined: most steps time nothing
            if not 1 < step % every < every - BASELINE_STEPS - 1 or step < self.full_window:
                budget.step_ended(step, sampled)
        return sampled

    def count_manual_step(self) -> None:
        """An update of the parameters without torch.optim (``p -= lr * p.grad``)."""
        self.state.manual_steps += 1
        self.state.last_progress = "parameter update"
        self._count_round(0)
        self._phase_sampled = False

    def _count_round(self, key: int) -> None:
        self.state.total_steps += 1
        round_ = self._round
        if not round_ or key in round_:
            self.step += 1
            if len(round_) != 1:  # the usual round, one optimizer's, is kept as it is
                self._round = {key}
        else:
            round_.add(key)

    def step_sampled(self, optimizer: Any) -> bool:
        """Is the coming (or just finished) step of this optimizer fully instrumented?"""
        if self._plain_optimizer() is not optimizer:
            optimizer = self._unwrap(optimizer)
        own = self.state.steps_of(optimizer)
        step = self.step
        return step < self.full_window or step % self.sample_every == 0 or own < self.full_window

    def _unwrap(self, optimizer: Any) -> Any:
        """``unwrap_optimizer``, remembering an optimizer that is no wrapper: the hooks of every
        step then ask one weak reference instead of walking ``.optimizer`` links."""
        inner = unwrap_optimizer(optimizer)
        if inner is optimizer:
            self._plain_optimizer = weakref.ref(optimizer)
        return inner

    def should_stop(self) -> bool:
        return self.max_steps is not None and self.step >= self.max_steps

    def elapsed(self) -> float:
        return time.perf_counter() - self.started
