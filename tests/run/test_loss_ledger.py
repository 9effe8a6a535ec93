"""The loss ledger (instrument/loss_ledger.py): each scalar loss read once for L106, L107, L108
and N101 — on the CPU at once, on CUDA through copies that land later (simulated here with
stand-in events, on a machine without a GPU)."""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from nndoctor.checks.chance import LossAtChance
from nndoctor.checks.evaluation import Overfitting
from nndoctor.checks.losses import LossNotDecreasing
from nndoctor.checks.nonfinite_loss import NonfiniteLoss
from nndoctor.core.engine import Session
from nndoctor.instrument.extensions import install
from nndoctor.instrument.loss_ledger import LOSS_LEDGER, LossLedger, loss_ledger
from nndoctor.run.end import finish
from tests.aten_ops import RecordOps


class _LateEvent:
    """A CUDA event stand-in whose copy lands after ``delay`` queries (or at synchronize)."""

    def __init__(self, delay: int) -> None:
        self.delay, self.left = delay, 0

    def record(self, stream: Any) -> None:
        self.left = self.delay

    def query(self) -> bool:
        if self.left:
            self.left -= 1
            return False
        return True

    def synchronize(self) -> None:
        self.left = 0


def _late_slots(delay: int):
    class Slots:
        """Host slots like the pinned ones, with events that land late."""

        def __init__(self, device: torch.device, size: int) -> None:
            self.device = device
            self.host = torch.zeros(size, dtype=torch.float32)
            self.slots = self.host.unbind()
            self.array = self.host.numpy()
            self.events = [_LateEvent(delay) for _ in range(size)]
            self.serials = [-1] * size

        def stream(self) -> None:
            return None

    return Slots


def test_a_loss_is_read_once_however_many_ask():
    ledger = LossLedger()
    loss = torch.tensor(2.5, requires_grad=True) * 2
    with RecordOps() as counted:
        serials = {ledger.record(loss) for _ in range(4)}
    assert serials == {0} and counted.ops == ["aten._local_scalar_dense.default"]
    assert ledger.landed(0) == ledger.value(0) == 5.0
    with torch.no_grad():
        loss.add_(1)  # changed in place: read again
    assert ledger.record(loss) == 1 and ledger.value(1) == 6.0
    assert ledger.record(torch.tensor(5.0)) == 2  # the same value, another tensor: another loss
    with torch.inference_mode():
        frozen = torch.tensor(7.0)  # no version counter: read each time, never mistaken for another
    assert ledger.record(frozen) == 3 and ledger.record(frozen) == 4 and ledger.values([3, 4]) == [7.0, 7.0]
    assert sys.getrefcount(loss) == 2  # a weak reference only


def test_copies_that_land_later_are_read_in_order_and_waited_for_only_when_asked():
    ledger = LossLedger(cuda_slots=4, slots=_late_slots(delay=2), event_every=1)
    losses = [torch.tensor(float(v)) for v in (1, 2, float("nan"), 4, 5, 6)]
    serials = [ledger.record(loss) for loss in losses[:3]]
    assert ledger.landed(serials[0]) is None  # in flight: polling does not wait
    assert ledger.landed(serials[0]) is None
    assert ledger.landed(serials[0]) == 1.0  # landed at the third query
    assert ledger.value(serials[1]) == 2.0  # waits
    assert math.isnan(ledger.values(serials)[2])
    # Six losses through four slots: a slot still in flight is read before it is reused.
    serials += [ledger.record(loss) for loss in losses[3:]]
    assert ledger.values(serials)[3:] == [4.0, 5.0, 6.0]


class _CountedEvent(_LateEvent):
    records = 0

    def record(self, stream: Any) -> None:
        type(self).records += 1
        super().record(stream)


def test_one_event_marks_a_group_of_copies():
    """An event behind every fourth copy (not one a copy): the copies before it are known
    landed when it is; a reader that waits for a copy of the open group marks it at once; a
    copy on another stream closes the group first (events order copies on their own stream)."""
    def slots(device, size):
        made = _late_slots(delay=0)(device, size)
        made.events = [_CountedEvent(0) for _ in range(size)]
        made.current = "default"
        made.stream = lambda: made.current
        return made

    _CountedEvent.records = 0
    ledger = LossLedger(cuda_slots=64, slots=slots, event_every=4)
    serials = [ledger.record(torch.tensor(float(v))) for v in range(6)]
    assert _CountedEvent.records == 1  # behind the fourth copy only
    assert [ledger.landed(s) for s in serials[:4]] == [0.0, 1.0, 2.0, 3.0]
    assert ledger.landed(serials[4]) is None  # no event behind it yet: not known to have landed
    assert ledger.value(serials[5]) == 5.0 and _CountedEvent.records == 2  # the wait marks the group
    ledger.record(torch.tensor(6.0))
    ledger._cuda[torch.device("cpu")].current = "side"  # the user switched streams
    ledger.record(torch.tensor(7.0))
    assert _CountedEvent.records == 3  # the copy on the default stream got its own event
    ledger.flush()
    assert ledger.values(range(8)) == [float(v) for v in range(8)] and _CountedEvent.records == 4


def test_values_older_than_the_kept_window_are_dropped_not_confused():
    ledger = LossLedger(keep=4)
    for v in range(10):
        ledger.record(torch.tensor(float(v)))
    assert ledger.oldest == 4
    assert ledger.values([0, 3, 4, 9]) == [None, None, 4.0, 9.0]


class _CountReads(TorchDispatchMode):
    items = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.items += 1
        return func(*args, **(kwargs or {}))


def _train(session: Session, steps: int, *, nan_at: int = -1, reads: _CountReads | None = None,
           count_from: int = 0, bad_inputs_from: int | None = None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    installation = install(session)
    for step in range(steps):
        if reads is not None and step == count_from:
            reads.__enter__()
        optimizer.zero_grad()
        if bad_inputs_from is not None and step >= bad_inputs_from:  # a NaN in the data from then on
            bad = x.clone()
            bad[0, 0] = float("nan")
            loss = criterion(model(bad), y)
            loss.backward()
            continue  # the loop's NaN guard: no update (GradScaler skips the step the same way)
        loss = criterion(model(x), y)
        if step == nan_at:
            loss = loss * float("nan")
        loss.backward()
        optimizer.step()
    if reads is not None:
        reads.__exit__(None, None, None)
    finish(session, installation, "completed", None)


def test_the_four_readers_read_the_loss_once_per_step():
    """L106, L107, L108 and N101 on a training loop: one serial a step, and on the unsampled
    steps (after the first 16) one item() a step and nothing else read."""
    session = Session(checks=[LossNotDecreasing, Overfitting, LossAtChance, NonfiniteLoss], sample_every=1000)
    reads = _CountReads()
    _train(session, 40, reads=reads, count_from=20)
    assert len(loss_ledger(session)) == 40
    assert reads.items == 20  # one loss read a step, by whichever check asked first
    assert not session.report.internal_errors


def test_n101_finds_a_nonfinite_loss_whose_copy_lands_steps_later():
    """The CUDA path of N101 (a loss polled without a synchronisation), with copies that land
    two polls later: the first non-finite step is still exact."""
    session = Session(checks=[], sample_every=1000, full_window=4)
    session.stash[LOSS_LEDGER] = LossLedger(slots=_late_slots(delay=2))
    session.add_checks([NonfiniteLoss])
    _train(session, 20, nan_at=9)
    (finding,) = [f for f in session.report.findings if f.code == "N101"]
    assert finding.first_step == 9, finding.message
    assert finding.evidence["traced_step"] > 9  # found when the copy landed, traced on a later forward
    assert not session.report.internal_errors


def test_n101_traces_a_nan_the_loop_skips_while_the_loop_still_runs():
    """Copies that land later and a loop that skips the update on a NaN (no optimizer step, so
    no sampled step comes): the backward() with no step since the last one makes the hook look
    at the landed losses, so the NaN is found and traced on one of the next forwards (the first
    module whose output is NaN, the first Linear), not left to the end of the run."""
    session = Session(checks=[], sample_every=1000, full_window=4)
    session.stash[LOSS_LEDGER] = LossLedger(slots=_late_slots(delay=1))
    session.add_checks([NonfiniteLoss])
    _train(session, 38, bad_inputs_from=30)
    (finding,) = [f for f in session.report.findings if f.code == "N101"]
    assert finding.first_step == 30 and finding.evidence["module"] == "0", finding.message
    assert not session.report.internal_errors


def test_l107_and_l106_sum_and_list_copies_that_land_later_in_order():
    from nndoctor.checks.evaluation import _LossSum

    ledger = LossLedger(cuda_slots=8, slots=_late_slots(delay=3))
    total = _LossSum(ledger)
    total._FOLD_AT = 4  # fold the landed ones often: the in-flight ones wait their turn
    values = [0.5 * i for i in range(1, 30)]
    for v in values:
        total.add(torch.tensor(v))
    assert total.mean_and_reset() == sum(values) / len(values)
    assert total.mean_and_reset() is None  # reset

    curves = []
    for ledger in (LossLedger(), LossLedger(slots=_late_slots(delay=2))):  # read at once; landing later
        session = Session(checks=[], sample_every=1000, full_window=4)
        session.stash[LOSS_LEDGER] = ledger
        session.add_checks([LossNotDecreasing])
        _train(session, 30)
        assert not session.report.internal_errors
        curves.append(session.checks[0]._values)
    assert len(curves[0]) == 30
    assert curves[1] == curves[0]  # the same curve, in order (float32 losses: exact in the slots)


class _CountAllOps(_CountReads):
    ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_on_the_cuda_path_the_four_readers_cost_three_ops_a_step():
    """With the loss copied to the host (the CUDA path, stand-in slots), an unsampled step of
    L106, L107, L108 and N101 costs three ops over the plain step — the copy of the loss, L108's
    targets and its argmax — where each reader used to copy or test the loss itself (seven
    kernel launches on a GPU)."""
    counted = []
    for checks in ([], [LossNotDecreasing, Overfitting, LossAtChance, NonfiniteLoss]):
        session = Session(checks=[], sample_every=1000)
        session.stash[LOSS_LEDGER] = LossLedger(slots=_late_slots(delay=0))
        session.add_checks(checks)
        ops = _CountAllOps()
        _train(session, 40, reads=ops, count_from=20)
        assert not session.report.internal_errors
        counted.append(ops.ops)
    assert counted[1] - counted[0] == 3 * 20
