"""L108's record of the training batches between two reads: two device ops a step, reduced
at the read.

A step writes its targets and its argmax predictions into preallocated rows on the loss's
device (one ``copy_``, one ``argmax(out=)``: no host sync, no reference to the user's tensors
kept); its loss is the session's loss ledger's (``instrument/loss_ledger.py``: read once for
L106, L107, L108 and N101), named by its serial. The validity of the targets, the right predictions, the number of
targets counted and the class counts are computed for all the rows at once when a sampled step
reads them: the same numbers as computing them step by step (integer sums; the loss rounded to
float32, and the per-step mean of a summed loss the same float32 division, on the host), for a
fraction of the kernels on every step.

A batch wider than ``MAX_WIDTH`` is reduced at once instead (about ten kernels, the way L108
did it for every batch before the ledger): the rows of targets would otherwise take
``rows × batch × 16`` bytes of the user's device memory.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from nndoctor.instrument.loss_ledger import LossLedger

# The widest batch kept as targets and predictions: 424 rows (sample every 100) × 2,048 × 16
# bytes = 14 MB at most on the device.
MAX_WIDTH = 2048


class _Row(NamedTuple):
    size: int  # the batch's targets (the row's first ``size`` columns); 0 for a reduced row
    ignore: int  # the loss's ignore_index
    summed: bool  # reduction="sum" and not reduced yet: the loss is divided by the targets counted
    loss: int = -1  # the loss's serial in the loss ledger (a kept row)
    reduced: bool = False  # (loss, correct, seen) computed at the step, in ``_reduced``
    value: float | None = None  # the loss's value, once taken from the loss ledger (``settle``)


class BatchLedger:
    """Rows of (targets, predictions) on one device, ``rows`` of them, and their losses' serials
    in the loss ledger; the columns grow with the largest batch seen, up to ``MAX_WIDTH``."""

    def __init__(self, rows: int, device: torch.device, losses: LossLedger) -> None:
        self.rows = rows
        self.device = device
        self._losses = losses
        self._width = -1
        self._targets = self._predicted = torch.zeros(0, 0, dtype=torch.int64)  # replaced by the first record
        self._target_rows: tuple[torch.Tensor, ...] = ()
        self._predicted_rows: tuple[torch.Tensor, ...] = ()
        self._reduced: torch.Tensor | None = None  # (loss, correct, seen) of the reduced rows
        self._pending: list[_Row] = []
        self.counts_read: list[float] | None = None  # the class counts as the last ``read`` left them

    def __len__(self) -> int:
        return len(self._pending)

    def record(self, logits: torch.Tensor, target: torch.Tensor, loss: torch.Tensor, ignore: int, *,
               summed: bool, counts: torch.Tensor) -> None:
        """Write one step's batch into the next row (the caller checks that one is free); the
        loss (one element) is read through the loss ledger. ``counts`` (per class, float64)
        takes a reduced batch's targets at once."""
        size = int(target.shape[0])
        if size > MAX_WIDTH:
            self._reduce_now(logits, target, loss, ignore, summed, counts)
            return
        if size > self._width:
            self._widen(size)
        k = len(self._pending)
        targets, predicted = self._target_rows[k], self._predicted_rows[k]
        if size != self._width:
            targets, predicted = targets[:size], predicted[:size]
        # Integer outputs record nothing for autograd.
        targets.copy_(target)
        torch.argmax(logits, 1, out=predicted)
        self._pending.append(_Row(size, ignore, summed, self._losses.record(loss)))

    def _reduce_now(self, logits: torch.Tensor, target: torch.Tensor, loss: torch.Tensor, ignore: int,
                    summed: bool, counts: torch.Tensor) -> None:
        """A batch too wide to keep: its (loss, correct, seen) and class counts now."""
        if self._reduced is None:
            self._reduced = torch.zeros(self.rows, 3, dtype=torch.float32, device=self.device)
        classes = int(logits.shape[1])
        with torch.no_grad():
            # An ignore_index outside [0, classes) is excluded by the range test already, and an
            # argmax (always in range) never equals an invalid target.
            ignore_in_range = 0 <= ignore < classes
            valid = (target >= 0) & (target < classes)
            if ignore_in_range:
                valid &= target != ignore
            safe = target * valid  # the invalid targets counted (with weight 0) as class 0
            predicted = logits.argmax(1)
            correct = ((predicted == safe) & valid).sum() if ignore_in_range else (predicted == target).sum()
            seen = valid.sum()
            value = loss.float()
            if value.dim():
                value = value.reshape(())
            if summed:
                value = value / seen.clamp(min=1)
            torch.stack((value, correct, seen), out=self._reduced[len(self._pending)])
            counts.scatter_add_(0, safe if safe.dtype == torch.int64 else safe.long(), valid.to(counts.dtype))
        self._pending.append(_Row(0, ignore, False, reduced=True))

    def _widen(self, width: int) -> None:
        """Columns for a larger batch (the first, or a larger one later: rare, no sync)."""
        targets = torch.zeros(self.rows, width, dtype=torch.int64, device=self.device)
        predicted = torch.zeros(self.rows, width, dtype=torch.int64, device=self.device)
        k, old = len(self._pending), self._width
        if k and old > 0:
            targets[:k, :old].copy_(self._targets[:k])
            predicted[:k, :old].copy_(self._predicted[:k])
        self._targets, self._predicted, self._width = targets, predicted, width
        self._target_rows, self._predicted_rows = targets.unbind(), predicted.unbind()

    def settle(self) -> None:
        """Take the pending rows' loss values that have reached the host from the loss ledger
        (all of them on the CPU): the ledger keeps a bounded history, and full rows may wait
        long for their read when sampled steps are rare (NNDOCTOR_SAMPLE_EVERY)."""
        losses = self._losses
        for i, row in enumerate(self._pending):
            if row.value is None and not row.reduced:
                value = losses.landed(row.loss)
                if value is not None:
                    self._pending[i] = row._replace(value=value)

    def read(self, classes: int, counts: torch.Tensor) -> list[tuple[float | None, int, int]]:
        """(loss, right predictions, targets counted) of each pending row, in order; adds the
        rows' valid targets to ``counts`` (per class, float64), whose values after that are left
        in ``counts_read``; empties the ledger. One sync.
        A loss is None only if the loss ledger dropped it (a run sampled very rarely)."""
        pending, self._pending = self._pending, []
        self.counts_read = None
        if not pending:
            return []
        k, device = len(pending), self.device
        reduced: list[list[float]] = []
        with torch.no_grad():
            counted = torch.zeros(k, 2, dtype=torch.int64, device=device)
            if self._width >= 0:  # some row was kept (an empty batch's too)
                counted = self._reduce_rows(pending, classes, counts)
            # One copy to the host for everything read here (on a GPU each read is a
            # synchronisation): the counts as float64 (integers below 2**53: exact), the
            # reduced rows as read before (float64), and the class counts (float64) for L108.
            parts = [counted.reshape(-1).double()]
            with_reduced = self._reduced is not None and any(row.reduced for row in pending)
            if with_reduced and self._reduced is not None:
                parts.append(self._reduced[:k].double().reshape(-1))
            parts.append(counts.reshape(-1).double())
            flat = torch.cat(parts).tolist()
            rows = [[int(flat[2 * i]), int(flat[2 * i + 1])] for i in range(k)]
            if with_reduced:
                width = (len(flat) - 2 * k - counts.numel()) // k
                reduced = [flat[2 * k + width * i: 2 * k + width * (i + 1)] for i in range(k)]
            self.counts_read = flat[len(flat) - counts.numel():]
        losses = iter(self._losses.values([row.loss for row in pending if not row.reduced and row.value is None]))
        out: list[tuple[float | None, int, int]] = []
        for i, row in enumerate(pending):
            if row.reduced:
                loss, right, seen = reduced[i]
                out.append((loss, int(right), int(seen)))
                continue
            right, seen = rows[i]
            value = row.value if row.value is not None else next(losses)
            if value is not None:
                # float32, as the device row held it; a summed loss divided as torch divides
                # a float32 by an integer count (both IEEE float32 divisions)
                value32 = np.float32(value)
                if row.summed:
                    value32 = value32 / np.float32(max(seen, 1))
                value = float(value32)
            out.append((value, right, seen))
        return out

    def _reduce_rows(self, pending: list[_Row], classes: int, counts: torch.Tensor) -> torch.Tensor:
        """(correct, seen) of the kept rows, (k, 2) int64; a reduced row gives zeros (its size
        is 0: no valid target)."""
        k, device = len(pending), self.device
        targets, predicted = self._targets[:k], self._predicted[:k]
        sizes = torch.tensor([row.size for row in pending], device=device)
        ignores = torch.tensor([row.ignore for row in pending], device=device)
        # A target counts when it is a class (an ignore_index outside [0, classes) is excluded
        # by the range test already) and lies within its row's batch.
        valid = (targets >= 0) & (targets < classes) & (targets != ignores[:, None])
        valid &= torch.arange(self._width, device=device) < sizes[:, None]
        correct = ((predicted == targets) & valid).sum(1)  # an argmax is a class: never equals an invalid target
        seen = valid.sum(1)
        counts.scatter_add_(0, (targets * valid).flatten(), valid.flatten().to(counts.dtype))
        return torch.stack((correct, seen), 1)
