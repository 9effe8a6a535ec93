"""L108's record of the training batches between two reads: three device ops a step, reduced
at the read.

A step writes its loss, its targets and its argmax predictions into preallocated rows on the
loss's device (one ``copy_``, one ``copy_``, one ``argmax(out=)``: no host sync, no reference
to the user's tensors kept). The validity of the targets, the right predictions, the number of
targets counted and the class counts are computed for all the rows at once when a sampled step
reads them: the same numbers as computing them step by step (integer sums; the per-step mean of
a summed loss is the same float32 division), for a fraction of the kernels on every step.

A batch wider than ``MAX_WIDTH`` is reduced at once instead (about ten kernels, the way L108
did it for every batch before the ledger): the rows of targets would otherwise take
``rows × batch × 16`` bytes of the user's device memory.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# The widest batch kept as targets and predictions: 424 rows (sample every 100) × 2,048 × 16
# bytes = 14 MB at most on the device.
MAX_WIDTH = 2048


class _Row(NamedTuple):
    size: int  # the batch's targets (the row's first ``size`` columns); 0 for a reduced row
    ignore: int  # the loss's ignore_index
    summed: bool  # reduction="sum" and not reduced yet: the loss is divided by the targets counted
    reduced: bool = False  # (loss, correct, seen) computed at the step, in ``_reduced``


class BatchLedger:
    """Rows of (loss, targets, predictions) on one device, ``rows`` of them; the columns grow
    with the largest batch seen, up to ``MAX_WIDTH``."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.rows = rows
        self.device = device
        self._losses = torch.zeros(rows, dtype=torch.float32, device=device)
        self._loss_slots = self._losses.unbind()  # made once: indexing per step is an op too
        self._width = -1
        self._targets = self._predicted = self._losses  # replaced by the first record
        self._target_rows: tuple[torch.Tensor, ...] = ()
        self._predicted_rows: tuple[torch.Tensor, ...] = ()
        self._reduced: torch.Tensor | None = None  # (loss, correct, seen) of the reduced rows
        self._pending: list[_Row] = []

    def __len__(self) -> int:
        return len(self._pending)

    def record(self, logits: torch.Tensor, target: torch.Tensor, loss: torch.Tensor, ignore: int, *,
               summed: bool, counts: torch.Tensor) -> None:
        """Write one step's batch into the next row (the caller checks that one is free).
        ``counts`` (per class, float64) takes a reduced batch's targets at once."""
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
        # Integer outputs record nothing for autograd; the loss is detached by the copy made
        # with grad mode off (what torch.no_grad() does, without its Python frames every step).
        targets.copy_(target)
        torch.argmax(logits, 1, out=predicted)
        grad_mode = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            self._loss_slots[k].copy_(loss if loss.dim() == 0 else loss.reshape(()))  # float32, as .float()
        finally:
            torch._C._set_grad_enabled(grad_mode)
        self._pending.append(_Row(size, ignore, summed))

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

    def read(self, classes: int, counts: torch.Tensor) -> list[tuple[float, int, int]]:
        """(loss, right predictions, targets counted) of each pending row, in order; adds the
        rows' valid targets to ``counts`` (per class, float64); empties the ledger. One sync."""
        pending, self._pending = self._pending, []
        if not pending:
            return []
        k, device = len(pending), self.device
        with torch.no_grad():
            values = torch.zeros(k, 3, dtype=torch.float64, device=device)
            if self._width >= 0:  # some row was kept (an empty batch's too: its loss is there)
                values = self._reduce_rows(pending, classes, counts)
            if self._reduced is not None and any(row.reduced for row in pending):
                reduced = torch.tensor([row.reduced for row in pending], device=device)
                values = torch.where(reduced[:, None], self._reduced[:k].double(), values)
            rows = values.tolist()
        return [(loss, int(right), int(counted)) for loss, right, counted in rows]

    def _reduce_rows(self, pending: list[_Row], classes: int, counts: torch.Tensor) -> torch.Tensor:
        """(loss, correct, seen) of the kept rows, as float64 (k, 3); a reduced row gives zeros
        (its size is 0: no valid target)."""
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
        losses = self._losses[:k]
        if any(row.summed for row in pending):  # Trainer's loss over the items of a batch
            summed = torch.tensor([row.summed for row in pending], device=device)
            losses = torch.where(summed, losses / seen.clamp(min=1), losses)
        counts.scatter_add_(0, (targets * valid).flatten(), valid.flatten().to(counts.dtype))
        return torch.stack((losses.double(), correct.double(), seen.double()), 1)
