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
- On CUDA the value is copied, without waiting, into a pinned host slot: one launch a step.
  A CUDA event recorded behind every 16th copy (``EVENT_EVERY``) marks the copies before it.
  ``landed`` answers when a copy is known to be done (polling the event never blocks);
  ``value`` waits for it — the readers do that only on sampled steps, where a
  synchronisation is allowed.

Nothing of the user's is kept: a weak reference to the last loss and plain floats.

**The training losses, without an event a step.** L106 (the curve), L107 (the training mean)
and N101 (the first non-finite loss) follow the loss ``backward()`` ran on, on every step. The
backward hook records it here itself (``record_backward``, when one of them ``follows``): one
read or copy, no event, no handler call on an unsampled step. They read what they need on
sampled steps (``backward_values``); a non-finite loss is announced to N101 as soon as its
value is on the host (``on_nonfinite``): at once on the CPU, when its copy lands on CUDA.
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
# One CUDA event marks a group of copies: copies queued on one stream land in order, so the
# event recorded behind the last of them says that all of them have landed (an event a copy
# cost a cudaEventRecord, ~4 µs of host time, on every step). A group closes after this many
# copies, when the stream changes, or when a reader waits for one of its copies.
EVENT_EVERY = 16
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


_CURRENT_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_stream(index: int) -> int | None:
    """The current stream's handle on device ``index`` (None: this torch cannot tell)."""
    return _CURRENT_RAW_STREAM(index) if _CURRENT_RAW_STREAM is not None else None


class LossLedger:
    """Serial numbers for the scalar losses of a run, and their values on the host."""

    def __init__(self, cuda_slots: int = CUDA_SLOTS, keep: int = KEEP, *,
                 slots: Callable[[torch.device, int], _CudaSlots] | None = None,
                 event_every: int = EVENT_EVERY) -> None:
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
        # (serial, slots, index, index of the slot whose event marks its group), oldest first
        self._in_flight: list[tuple[int, _CudaSlots, int, int]] = []
        self._open: list[tuple[int, _CudaSlots, int]] = []  # copies queued since the last event
        self._open_stream: Any = None  # the stream they were queued on
        self._event_every = max(1, event_every)
        # The losses backward() ran on (``record_backward``): their serials and steps, from
        # the ``_backward_base``-th on (older ones go with their values: ``_drop``).
        self._backward: list[int] = []
        self._backward_steps: list[int] = []
        self._backward_base = 0
        # Called with (serial, step, frame) of a backward loss found non-finite, as its value
        # lands (the frame of the backward() call on the CPU, where that is at once; else None).
        self._nonfinite_listeners: list[Callable[[int, int, Any], None]] = []
        self._steps: dict[int, int] = {}  # serial -> step, of backward losses in flight (CUDA)

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

    def _pending(self) -> int | None:
        """The oldest serial whose copy has not been taken in (None: none)."""
        if self._in_flight:
            return self._in_flight[0][0]
        return self._open[0][0] if self._open else None

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
        pending = self._pending()
        if wanted and pending is not None and pending <= max(wanted):
            self._harvest(wait=True, until=max(wanted))
        base, values = self._base, self._values
        return [values[s - base] if s >= base else None for s in wanted]

    # -- the losses backward() ran on ----------------------------------------------------------
    def record_backward(self, tensor: torch.Tensor, step: int, frame: Any = None) -> None:
        """The backward hook's call, on every backward() of a one-element floating-point
        tensor while a reader follows them: recorded (read or copied, once), and checked for a
        non-finite value once it is on the host."""
        serial = self.record(tensor)  # read once: L108's loss handler may have read it already
        self._backward.append(serial)
        self._backward_steps.append(step)
        value = self._values[serial - self._base]
        if value is None:  # in flight (CUDA): checked when it lands (``_harvest``)
            if self._nonfinite_listeners:
                self._steps[serial] = step
        elif value - value != 0.0 and self._nonfinite_listeners:  # NaN or ±Inf, without a call
            self._announce(serial, step, frame)

    @property
    def backward_count(self) -> int:
        """backward() losses recorded so far: a reader's cursor starts here."""
        return self._backward_base + len(self._backward)

    def backward_values(self, cursor: int, end: int | None = None) -> tuple[int, list[float]]:
        """The values of the backward() losses from the ``cursor``-th on, up to the ``end``-th
        (excluded; default: all; dropped ones left out), and the cursor past them. Waits for
        copies still in flight: a synchronisation on CUDA, for sampled steps and the ends of
        evaluations."""
        start = max(cursor - self._backward_base, 0)
        stop = None if end is None else max(end - self._backward_base, start)
        serials = self._backward[start:stop]
        if not serials:
            return max(cursor, self._backward_base), []
        values = self.values(serials)
        return self._backward_base + start + len(serials), [v for v in values if v is not None]

    def poll(self, *, close: bool = False) -> None:
        """Take in the copies that have landed, without waiting (announcing non-finite ones);
        ``close``: mark the open group first, so that the next poll can take it in."""
        if close and self._open:
            self._close_group()
        if self._in_flight:
            self._harvest(wait=False)

    def flush(self) -> None:
        """Take in every copy in flight, waiting for them (the end of a run)."""
        if self._in_flight or self._open:
            self._harvest(wait=True, until=len(self))

    def backward_step(self, cursor: int) -> int | None:
        """The step of the ``cursor``-th backward() loss, if it is still kept."""
        i = cursor - self._backward_base
        return self._backward_steps[i] if 0 <= i < len(self._backward_steps) else None

    def on_nonfinite(self, listener: Callable[[int, int, Any], None]) -> None:
        """Call ``listener(serial, step, frame)`` for each backward() loss whose value is NaN
        or ±Inf, once it is on the host (``frame``: the backward() call's, when that is now)."""
        self._nonfinite_listeners.append(listener)

    def _announce(self, serial: int, step: int, frame: Any) -> None:
        for listener in self._nonfinite_listeners:
            listener(serial, step, frame)

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
        stream = slots.stream()
        if self._open and (stream is not self._open_stream or slots is not self._open[-1][1]):
            self._close_group()  # the copies so far were queued elsewhere: their own event
        slots.serials[index] = serial
        self._open.append((serial, slots, index))
        self._open_stream = stream
        if len(self._open) >= self._event_every:
            self._close_group()

    def _close_group(self) -> None:
        """Record one event behind the open copies (on their stream): it marks all of them."""
        open_, marker = self._open, self._open[-1]
        marker[1].events[marker[2]].record(self._open_stream)
        self._in_flight.extend((serial, slots, index, marker[2]) for serial, slots, index in open_)
        self._open = []

    def _harvest(self, *, wait: bool, until: int = -1) -> None:
        """Move landed copies to the host list, oldest first; with ``wait``, every copy up to
        serial ``until`` (blocking on its group's event)."""
        if wait and self._open and self._open[0][0] <= until:
            self._close_group()  # a reader waits for a copy of the open group: mark it now
        done = 0
        event: Any = None
        landed = False
        for serial, slots, index, marker in self._in_flight:
            if slots.events[marker] is not event:  # one query for a group
                event = slots.events[marker]
                landed = event.query()
            if not landed:
                if not (wait and serial <= until):
                    break
                event.synchronize()
                landed = True
            i = serial - self._base
            if i >= 0:
                self._values[i] = value = float(slots.array[index])
                if self._steps:
                    step = self._steps.pop(serial, None)
                    if step is not None and value - value != 0.0:
                        self._announce(serial, step, None)
            slots.serials[index] = -1
            done += 1
        if done:
            del self._in_flight[:done]

    def _drop(self, count: int) -> None:
        pending = self._pending()
        if pending is not None and pending < self._base + count:
            self._harvest(wait=True, until=self._base + count - 1)
        del self._values[:count]
        self._base += count
        gone = 0  # the backward() losses whose values went
        while gone < len(self._backward) and self._backward[gone] < self._base:
            gone += 1
        if gone:
            del self._backward[:gone], self._backward_steps[:gone]
            self._backward_base += gone


LOSS_LEDGER = StashKey[LossLedger]("loss ledger")


def loss_ledger(session: Any, *, follow_backward: bool = False) -> LossLedger:
    """The session's ledger (made on first use). ``follow_backward``: a reader of the losses
    backward() runs on; from now on the backward hook records each of them here
    (``session.state.loss_feed``)."""
    stash = session.stash
    try:
        ledger = stash[LOSS_LEDGER]
    except KeyError:
        ledger = stash[LOSS_LEDGER] = LossLedger()
    if follow_backward:
        session.state.loss_feed = ledger
    return ledger
