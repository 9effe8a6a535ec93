"""The loss ledger: every scalar loss of the run read once, for every check that wants it.

L106 (the loss curve), L107 (training-loss sums), L108 (the chance-level test) and N101 (the
first non-finite loss) all look at the same loss on every step. Each used to copy or read it
on its own: on a GPU that was four kernel launches a step (a slot copy, a device sum, a
finiteness flag and its copy to the host, a row copy), on a CPU two ``item()`` calls. The
ledger reads each loss tensor once — whichever of them asks first — and hands the same
serial number to the others (the same tensor object, unchanged since: a weak reference and
its version counter say so).

- On the CPU (and any device that is not CUDA) the value is read at once with ``item()``:
  ~1 µs, nothing to wait for (on other accelerators it waits, as N101's flag did before).
- On CUDA the value is copied, without waiting, into a pinned host slot and a CUDA event is
  recorded behind the copy: one launch a step. ``landed`` answers when the copy is done
  (polling the event never blocks); ``value`` waits for it — the readers do that only on
  sampled steps, where a synchronisation is allowed.

Nothing of the user's is kept: a weak reference to the last loss and plain floats.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from nndoctor.core.stash import StashKey

# Pinned slots per CUDA device, reused round-robin: a slot is harvested (its value moved to the
# host list, waiting if its copy has not landed: rare) before it is written again. Enough for
# several sampled intervals of the default 100 steps, gradient accumulation included.
CUDA_SLOTS = 1024
# Values kept on the host (at most twice this many, ~2 MB): the readers read theirs at least
# once per sampled interval. Older values are dropped in chunks (``value`` then answers None):
# only a run sampled less than once in ~30,000 losses (NNDOCTOR_SAMPLE_EVERY) can lose some.
KEEP = 1 << 15


def _dead() -> None:
    return None


class _CudaSlots:
    """The pinned host slots and events of one CUDA device."""

    def __init__(self, device: torch.device, size: int) -> None:
        self.device = device
        self.host = torch.empty(size, dtype=torch.float32, pin_memory=True)
        self.slots = self.host.unbind()  # views made once: indexing on every step is an op too
        self.array = self.host.numpy()  # read without an op per value
        self.events: list[Any] = [torch.cuda.Event() for _ in range(size)]
        self.serials = [-1] * size  # which serial each slot holds (-1: none, or harvested)
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._raw: int | None = None  # the current stream's handle when ``_stream`` was made
        self._stream: Any = None

    def stream(self) -> Any:
        """Where the copy was queued: the event is recorded behind it. The Stream object is
        made again only when the current stream changed: ``torch.cuda.current_stream`` builds
        a new one on every call (~10 µs a step), its raw handle is one C call."""
        raw = _raw_stream(self._index)
        if raw is None or raw != self._raw:
            self._stream, self._raw = torch.cuda.current_stream(self.device), raw
        return self._stream


def _raw_stream(index: int) -> int | None:
    """The current stream's handle on device ``index`` (None: this torch cannot tell)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(index) if get is not None else None


class LossLedger:
    """Serial numbers for the scalar losses of a run, and their values on the host."""

    def __init__(self, cuda_slots: int = CUDA_SLOTS, keep: int = KEEP, *,
                 slots: Callable[[torch.device, int], _CudaSlots] | None = None) -> None:
        # ``slots``: the tests' stand-in for pinned memory and CUDA events, through which a CPU
        # loss takes the CUDA path (copies that land later), on a machine without a GPU.
        self._make_slots = slots or _CudaSlots
        self._asynchronous_cpu = slots is not None
        self._cuda_slots = cuda_slots
        self._keep = keep
        self._values: list[float | None] = []  # by serial - self._base; None: not landed yet
        self._base = 0
        self._last_ref: Any = _dead  # weakref.ref to the last tensor read (or a dead stand-in)
        self._last_version = -1
        self._last_serial = -1
        self._cuda: dict[torch.device, _CudaSlots] = {}
        self._in_flight: list[tuple[int, _CudaSlots, int]] = []  # (serial, slots, index), oldest first

    def __len__(self) -> int:
        """Losses recorded so far (the next serial)."""
        return self._base + len(self._values)

    @property
    def oldest(self) -> int:
        """The oldest serial whose value is kept (older ones were dropped: ``KEEP``)."""
        return self._base

    def record(self, tensor: torch.Tensor) -> int:
        """The serial of this one-element floating-point loss: read now (CPU) or copied without
        waiting (CUDA); the same serial for the same, unchanged tensor asked again."""
        try:
            version = tensor._version
        except RuntimeError:  # an inference tensor has no version counter: never deduplicated
            version = -1
        if version >= 0 and version == self._last_version and self._last_ref() is tensor:
            return self._last_serial
        serial = self._base + len(self._values)
        if tensor.is_cuda or self._asynchronous_cpu:
            self._values.append(None)
            self._copy(tensor, serial)
        else:
            self._values.append(tensor.item())  # item() records nothing for autograd
        self._last_ref = weakref.ref(tensor) if version >= 0 else _dead
        self._last_version = version
        self._last_serial = serial
        if len(self._values) > 2 * self._keep:
            self._drop(self._keep)
        return serial

    def read(self, tensor: torch.Tensor) -> tuple[int, float | None]:
        """``record`` and ``landed`` in one call (the readers of every step ask both): the
        serial, and the value if it is on the host already (always, on the CPU)."""
        try:  # record's look-up for the same tensor, inlined: the usual second reader of a step
            version = tensor._version
        except RuntimeError:
            version = -1
        if version >= 0 and version == self._last_version and self._last_ref() is tensor:
            serial = self._last_serial
        else:
            # Copied just now: on CUDA it has not landed yet (no event to ask); on the CPU it
            # was read. Earlier copies are harvested when a reader polls (``landed``).
            serial = self.record(tensor)
            return serial, self._values[serial - self._base]
        value = self._values[serial - self._base]
        if value is None and self._in_flight:
            self._harvest(wait=False)
            value = self._values[serial - self._base]
        return serial, value

    def landed(self, serial: int) -> float | None:
        """The value if it is on the host already; never waits."""
        i = serial - self._base
        if i < 0:
            return None
        value = self._values[i]
        if value is None and self._in_flight:
            self._harvest(wait=False)
            value = self._values[i]
        return value

    def value(self, serial: int) -> float | None:
        """The value, waiting for its copy if needed (a synchronisation on CUDA: sampled steps
        only); None if it was dropped (``KEEP``)."""
        value = self.landed(serial)
        if value is None and serial >= self._base:
            self._harvest(wait=True, until=serial)
            value = self._values[serial - self._base]
        return value

    def values(self, serials: Iterable[int]) -> list[float | None]:
        wanted = list(serials)
        if wanted and self._in_flight and self._in_flight[0][0] <= max(wanted):
            self._harvest(wait=True, until=max(wanted))
        base, values = self._base, self._values
        return [values[s - base] if s >= base else None for s in wanted]

    # -- CUDA ----------------------------------------------------------------------------------
    def _copy(self, tensor: torch.Tensor, serial: int) -> None:
        device = tensor.device
        slots = self._cuda.get(device)
        if slots is None:
            slots = self._cuda[device] = self._make_slots(device, self._cuda_slots)
        index = serial % len(slots.slots)
        if slots.serials[index] >= 0:  # the slot's last value not read yet: read it first
            self._harvest(wait=True, until=slots.serials[index])
        grad_mode = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # the copy records nothing for autograd (no no_grad frames)
        try:
            slots.slots[index].copy_(tensor if tensor.dim() == 0 else tensor.reshape(()), non_blocking=True)
        finally:
            torch._C._set_grad_enabled(grad_mode)
        slots.events[index].record(slots.stream())
        slots.serials[index] = serial
        self._in_flight.append((serial, slots, index))

    def _harvest(self, *, wait: bool, until: int = -1) -> None:
        """Move landed copies to the host list, oldest first; with ``wait``, every copy up to
        serial ``until`` (blocking on its event)."""
        done = 0
        for serial, slots, index in self._in_flight:
            event = slots.events[index]
            if not event.query():
                if not (wait and serial <= until):
                    break
                event.synchronize()
            i = serial - self._base
            if i >= 0:
                self._values[i] = float(slots.array[index])
            slots.serials[index] = -1
            done += 1
        if done:
            del self._in_flight[:done]

    def _drop(self, count: int) -> None:
        in_flight = [serial for serial, _, _ in self._in_flight if serial < self._base + count]
        if in_flight:
            self._harvest(wait=True, until=max(in_flight))
        del self._values[:count]
        self._base += count


LOSS_LEDGER = StashKey[LossLedger]("loss ledger")


def loss_ledger(session: Any) -> LossLedger:
    """The session's ledger (made on first use)."""
    stash = session.stash
    try:
        return stash[LOSS_LEDGER]
    except KeyError:
        ledger = stash[LOSS_LEDGER] = LossLedger()
        return ledger
