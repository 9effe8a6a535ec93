"""Host reads on a sampled step: O101, D105 and L108 each read the device once (one copy to the
host), not once per value — on a GPU every read is a synchronisation (issue 30,
benchmarks/sampled_step_ops.py) — and they read the same numbers as before."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nndoctor.checks._chance_ledger import BatchLedger
from nndoctor.checks.gradient_flow import fingerprints
from nndoctor.checks.inputs import batch_label_summary, device_label_summary
from nndoctor.instrument.loss_ledger import LossLedger

# ATen operations that make the host wait for the device (on the CPU they dispatch too).
SYNCS = {"_local_scalar_dense", "equal", "nonzero", "is_nonzero"}


class _Reads:
    def __init__(self) -> None:
        self.syncs: list[str] = []
        self.copies = 0  # tolist()/cpu() calls: one copy to the host each (nothing dispatched on a CPU)


@contextmanager
def counting_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Reads]:
    reads = _Reads()

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            if func.overloadpacket.__name__ in SYNCS:
                reads.syncs.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    for name in ("tolist", "cpu"):
        original = getattr(torch.Tensor, name)

        def method(self, *args, _original=original, **kwargs):
            reads.copies += 1
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, method)
    with Mode():
        yield reads


def test_o101_reads_the_nonzero_flags_of_its_sampled_gradients_in_one_copy(monkeypatch):
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3, generator=g)) for _ in range(8)]
    for i, p in enumerate(params):
        p.grad = torch.zeros_like(p) if i % 3 == 0 else torch.randn(5, 3, generator=g)
    params.append(torch.nn.Parameter(torch.ones(2)))  # no gradient: no fingerprint
    with counting_reads(monkeypatch) as reads:
        snaps = fingerprints(params, with_values=False)
    assert reads.syncs == [] and reads.copies == 1
    assert [snap.nonzero for snap in snaps] == [bool(p.grad.any()) for p in params[:8]]
    assert [snap.param() for snap in snaps] == params[:8]
    assert [snap.grad_id for snap in snaps] == [id(p.grad) for p in params[:8]]


def test_d105_reads_a_batch_label_summary_in_one_copy(monkeypatch):
    """The accelerator path (run here on CPU tensors): one copy to the host. Labels on the CPU
    are counted by NumPy on the tensor's memory: no torch op at all, the same summary."""
    labels = torch.tensor([3, 3, -100, 1, 3, 0, 3, 2])
    with counting_reads(monkeypatch) as reads:
        summary = device_label_summary(labels)
    # The mask's size (nonzero on a GPU) is read by the boolean indexing, as before; then one copy.
    assert reads.syncs == [] and reads.copies == 1
    assert summary == (3, 4 / 7, 7)
    with counting_reads(monkeypatch) as reads:
        assert batch_label_summary(labels) == summary
    assert reads.syncs == [] and reads.copies == 0
    many = torch.zeros(300, dtype=torch.uint8)  # a count above the labels' own type's range
    assert batch_label_summary(many) == device_label_summary(many) == (0, 1.0, 300)
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.int64, torch.int32, torch.int16, torch.uint8):  # ties: the smallest label, as torch.mode
        for _ in range(200):
            batch = torch.randint(0, 5, (int(torch.randint(1, 20, (1,), generator=generator)),),
                                  generator=generator).to(dtype)
            assert batch_label_summary(batch) == device_label_summary(batch), batch
    huge = torch.tensor([10**9, 2, 10**9, -1])  # past the bincount limit: sorted unique values
    assert batch_label_summary(huge) == device_label_summary(huge) == (10**9, 2 / 3, 3)


def test_l108_reads_the_ledger_rows_and_the_class_counts_in_one_copy(monkeypatch):
    g = torch.Generator().manual_seed(1)
    ledger = BatchLedger(8, torch.device("cpu"), LossLedger())
    counts = torch.zeros(4, dtype=torch.float64)
    for _ in range(3):
        logits, target = torch.randn(6, 4, generator=g), torch.randint(0, 4, (6,), generator=g)
        ledger.record(logits, target, torch.nn.functional.cross_entropy(logits, target), -100,
                      summed=False, counts=counts)
    with counting_reads(monkeypatch) as reads:
        rows = ledger.read(4, counts)
    assert reads.syncs == [] and reads.copies == 1
    assert ledger.counts_read == counts.tolist() and sum(ledger.counts_read) == 18
    assert [seen for _, _, seen in rows] == [6, 6, 6]
    assert all(isinstance(right, int) and isinstance(seen, int) for _, right, seen in rows)
    assert ledger.read(4, counts) == [] and ledger.counts_read is None  # nothing pending: nothing read
