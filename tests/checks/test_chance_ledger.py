"""L108's batch ledger: two ops a step (the loss read once by the loss ledger), and the same
numbers as reducing each step at once."""

from __future__ import annotations

import pytest
import torch

from nndoctor.checks import _chance_ledger as chance_ledger
from nndoctor.checks._chance_ledger import BatchLedger
from nndoctor.instrument.loss_ledger import LossLedger
from tests.aten_ops import RecordOps

CLASSES = 5


def _reduced_at_once(logits, target, loss, ignore, summed, counts):
    """The per-step reduction L108 computed before the ledger (the reference)."""
    ignore_in_range = 0 <= ignore < CLASSES
    valid = (target >= 0) & (target < CLASSES)
    if ignore_in_range:
        valid &= target != ignore
    safe = target * valid
    predicted = logits.argmax(1)
    correct = ((predicted == safe) & valid).sum() if ignore_in_range else (predicted == target).sum()
    seen = valid.sum()
    value = loss.float().reshape(())
    if summed:
        value = value / seen.clamp(min=1)
    row = torch.stack((value, correct, seen)).tolist()  # float32, as the old row was
    counts.scatter_add_(0, safe.long(), valid.to(counts.dtype))
    return row[0], int(row[1]), int(row[2])


def _batches():
    g = torch.Generator().manual_seed(3)
    # Sizes that grow (the columns widen with rows pending) and shrink (a last partial batch).
    for step, size in enumerate([4, 4, 7, 3, 7, 12, 1, 0, 12, 5]):
        logits = torch.randn(size, CLASSES, generator=g)
        target = torch.randint(-1, CLASSES + 1, (size,), generator=g)  # some out of range
        ignore = (-100, 2, 7)[step % 3]  # out of range, a class, above the classes
        if size:
            target[0] = ignore
        dtype = torch.bfloat16 if step % 4 == 1 else torch.float32
        loss = (torch.rand((), generator=g) * 3).to(dtype)
        yield logits, target.to(torch.int32 if step == 2 else torch.int64), loss, ignore, step % 2 == 1


# 6: the batches wider than that are reduced at once; 0: all but the empty one; -1: all
@pytest.mark.parametrize("max_width", [2048, 6, 0, -1])
def test_the_ledger_gives_the_per_step_numbers(monkeypatch, max_width):
    monkeypatch.setattr(chance_ledger, "MAX_WIDTH", max_width)
    ledger = BatchLedger(16, torch.device("cpu"), LossLedger())
    counts, expected_counts = torch.zeros(CLASSES, dtype=torch.float64), torch.zeros(CLASSES, dtype=torch.float64)
    expected = []
    for logits, target, loss, ignore, summed in _batches():
        ledger.record(logits, target, loss, ignore, summed=summed, counts=counts)
        expected.append(_reduced_at_once(logits, target.long(), loss, ignore, summed, expected_counts))
    assert len(ledger) == 10
    assert ledger.read(CLASSES, counts) == expected  # bit for bit: float32 losses, exact counts
    assert torch.equal(counts, expected_counts)
    assert len(ledger) == 0 and ledger.read(CLASSES, counts) == []


def test_a_step_costs_three_ops_with_the_loss_and_keeps_no_reference():
    ledger = BatchLedger(8, torch.device("cpu"), LossLedger())
    logits, target = torch.randn(6, CLASSES), torch.randint(0, CLASSES, (6,))
    counts = torch.zeros(CLASSES, dtype=torch.float64)
    ledger.record(logits, target, torch.tensor(1.0), -100, summed=False, counts=counts)  # allocates the columns
    logits = torch.randn(6, CLASSES, requires_grad=True) * 1  # as in training: part of the graph
    loss = torch.tensor(0.5, requires_grad=True) * 2
    with RecordOps() as counted:
        ledger.record(logits, target, loss, -100, summed=False, counts=counts)
    assert torch.is_grad_enabled()  # restored
    assert not ledger._targets.requires_grad and not ledger._predicted.requires_grad  # no graph kept
    writes = [op for op in counted.ops if "copy_" in op or "argmax" in op or "_local_scalar_dense" in op]
    assert len(writes) == 3 and len(counted.ops) <= 4, counted.ops  # a narrowing view at most besides
    # the loss was read by the loss ledger: a second reader of the same loss costs no op
    with RecordOps() as again:
        assert ledger._losses.record(loss) == len(ledger._losses) - 1
    assert again.ops == []
    import sys
    assert sys.getrefcount(target) == 2 and sys.getrefcount(logits) == 2  # ours only: no copy kept


def test_settled_rows_keep_their_losses_when_the_loss_ledger_drops_old_values():
    """Rows waiting long for their read (rare sampled steps) take their losses from the loss
    ledger first: its bounded history may drop them before the read."""
    losses = LossLedger(keep=4)
    ledger = BatchLedger(8, torch.device("cpu"), losses)
    counts = torch.zeros(CLASSES, dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    for step in range(6):
        logits, target = torch.randn(4, CLASSES, generator=g), torch.randint(0, CLASSES, (4,), generator=g)
        ledger.record(logits, target, torch.tensor(0.25 * (step + 1)), -100, summed=False, counts=counts)
    ledger.settle()
    for step in range(20):  # later losses (other readers): the loss ledger drops the oldest
        losses.record(torch.tensor(float(step)))
    assert losses.values([0]) == [None]
    assert [loss for loss, _, _ in ledger.read(CLASSES, counts)] == [0.25 * (step + 1) for step in range(6)]
