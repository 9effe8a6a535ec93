"""DistributedDataParallel and collectives: what the X checks and the stall watchdog need.

- ``DistributedDataParallel.__init__`` is wrapped to remember, by weak reference, each
  wrapper's inner module and the parameters it was built with (ids, shapes, devices: no
  tensors), so a forward that bypasses the wrapper or parameters changed after wrapping
  can be recognised.
- The ``torch.distributed`` collectives called from Python are wrapped to record which
  collective this process is in and from which user line (read by the watchdog when the
  run stalls), and ``init_process_group`` to learn this process's rank.
"""

from __future__ import annotations

import functools
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nndoctor.core.stash import StashKey
from nndoctor.run.distributed.parts import rank_data

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
    "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "barrier", "gather", "gather_object", "scatter", "scatter_object_list",
    "monitored_barrier",
)


@dataclass
class WrapRecord:
    """What a DDP wrapper looked like when it was built (plain values only)."""

    ddp: weakref.ref
    params: dict[int, tuple[str, tuple[int, ...], str, str]]  # id -> (name, shape, device, dtype)
    location: str | None
    checked_changes: bool = False


@dataclass
class DdpRegistry:
    """Per-session DDP facts: inner module -> its wrapper's record."""

    by_inner: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    by_wrapper: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    # Called when a wrapper is built (X107 arms its forward handler: idle in a run without DDP).
    on_built: list[Any] = field(default_factory=list)


@dataclass
class CollectiveState:
    """The collective this process is blocked in, if any (read by the watchdog thread)."""

    name: str | None = None
    location: str | None = None
    since: float = 0.0
    count: int = 0
    # The caller's frame while inside the collective (resolved to a user line only if the
    # watchdog has to report; dropped as soon as the collective returns).
    frame_ref: Any = None


DDP_REGISTRY = StashKey[DdpRegistry]("DDP wrappers")
COLLECTIVE_STATE = StashKey[CollectiveState]("current collective")
# Storage addresses of the tensors this process broadcast (``dist.broadcast``): a model whose
# every parameter was broadcast is replicated by hand (X104 compares its replicas).
BROADCAST_ADDRESSES = StashKey[set[int]]("tensors broadcast")
_MAX_BROADCAST_ADDRESSES = 1_000_000
# Under torchrun: this rank's flight record (nndoctor.run.distributed.flight.FlightRecorder).
FLIGHT_RECORDER = StashKey[Any]("flight recorder")


def registry(session: Any) -> DdpRegistry:
    return session.stash.get_or_create(DDP_REGISTRY, DdpRegistry)


def collective_state(session: Any) -> CollectiveState:
    return session.stash.get_or_create(COLLECTIVE_STATE, CollectiveState)


def param_signature(module: Any) -> dict[int, tuple[str, tuple[int, ...], str, str]]:
    return {
        id(p): (name, tuple(p.shape), str(p.device), str(p.dtype).replace("torch.", ""))
        for name, p in module.named_parameters()
    }


def install(installation: InstallationProtocol) -> None:
    try:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # torch built without distributed support
        return
    if not dist.is_available():
        return
    session = installation.session
    patcher = installation.patcher
    ddp_registry = registry(session)

    original_init = DistributedDataParallel.__init__

    @functools.wraps(original_init)
    def ddp_init(self, module, *args, **kwargs):
        original_init(self, module, *args, **kwargs)
        if session.active:
            try:
                from nndoctor.core.user_code import user_location

                where = user_location(sys._getframe(1))
                record = WrapRecord(ddp=weakref.ref(self), params=param_signature(self.module),
                                    location=str(where) if where else None)
                ddp_registry.by_inner[self.module] = record
                ddp_registry.by_wrapper[self] = record
                for callback in ddp_registry.on_built:
                    callback()
                flight = session.stash.get(FLIGHT_RECORDER, None)
                if flight is not None:
                    flight.ddp = True
            except Exception as error:  # noqa: BLE001 - observer rule
                session.internal_error("DDP wrap record", error)

    patcher.patch(DistributedDataParallel, "__init__", ddp_init)
    recorder = _start_flight_recorder(session, patcher)
    _patch_collectives(session, patcher, dist, recorder)
    _patch_init_process_group(session, patcher, dist)


class _FlightNotes:
    """Notes each backward and optimizer step in the flight record (a subscriber, no catalog code)."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    def on_backward(self, event: Any) -> None:
        self.recorder.note_phase("backward", event.step, _user_line(event.frame))

    def on_backward_done(self, event: Any) -> None:
        # Past DDP's gradient all-reduce: a rank that dies now was not in it.
        self.recorder.note_phase("after backward", event.step)

    def on_step_end(self, event: Any) -> None:
        self.recorder.note_phase("after step", event.step, "")


def _user_line(frame: Any) -> str:
    from nndoctor.core.user_code import user_location

    where = user_location(frame) if frame is not None else None
    return str(where) if where else ""


def _start_flight_recorder(session: Any, patcher: Any) -> Any:
    """Under torchrun (or in a process the script started): this rank's flight record, for the
    report when it dies without Python."""
    from nndoctor.run.distributed.context import torchrun_rank
    from nndoctor.run.distributed.parts import child_part

    info = torchrun_rank()
    child = child_part(session)
    if info is not None:
        from nndoctor.run.distributed.context import parts_dir

        folder, rank, world = parts_dir(info), info.rank, info.world_size
    elif child is not None:  # a process the script started (mp.spawn): its index
        folder, rank, world = child[0], child[1], 0
    else:
        return None
    from nndoctor.run.distributed.flight import FlightRecorder

    try:
        recorder = FlightRecorder(folder, rank, world)
        recorder.catch_fatal_signals()
    except Exception as error:  # noqa: BLE001 - observer rule: the run goes on without a record
        session.internal_error("flight recorder", error)
        return None
    session.stash[FLIGHT_RECORDER] = recorder
    session.subscribe(_FlightNotes(recorder))

    def close() -> None:
        rank_data(session)["flight"] = recorder.snapshot()
        recorder.close()

    patcher.on_undo(close)
    return recorder


def _tensor_facts(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, str]:
    """(element count, dtype) of the collective's tensor: the first tensor among its first
    arguments, or the first of a tensor list."""
    import torch

    for value in (*args[:2], kwargs.get("tensor"), kwargs.get("tensor_list")):
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, torch.Tensor):
            return int(value.numel()), str(value.dtype).replace("torch.", "")
    return 0, ""


def _note_broadcast(session: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    tensor: Any = args[0] if args else kwargs.get("tensor")
    try:
        addresses = session.stash.get_or_create(BROADCAST_ADDRESSES, set)
        if len(addresses) < _MAX_BROADCAST_ADDRESSES:
            addresses.add(int(tensor.data_ptr()))  # p.data and p share it
    except Exception:  # noqa: BLE001 - not a tensor: nothing to note
        pass


def broadcast_addresses(session: Any) -> set[int]:
    return session.stash.get(BROADCAST_ADDRESSES, set())


def _patch_collectives(session: Any, patcher: Any, dist: Any, recorder: Any = None) -> None:
    state = collective_state(session)

    def make(name: str, original: Any) -> Any:
        @functools.wraps(original)
        def collective(*args, **kwargs):
            if not session.active or state.name is not None:  # nested (e.g. *_object helpers)
                return original(*args, **kwargs)
            frame = sys._getframe(1)
            state.name, state.since, state.location = name, time.monotonic(), None
            state.count += 1
            state.frame_ref = frame  # resolved by the watchdog only if it has to report
            if name == "broadcast":
                _note_broadcast(session, args, kwargs)
            if recorder is not None:
                try:
                    numel, dtype = _tensor_facts(args, kwargs)
                    recorder.enter(name, numel, dtype, _user_line(frame))
                except Exception as error:  # noqa: BLE001 - observer rule
                    session.internal_error("flight record", error)
            try:
                result = original(*args, **kwargs)
            finally:
                state.name, state.frame_ref = None, None
            # Only a collective that returned is left: one that raised stays the last one entered.
            if recorder is not None:
                recorder.leave()
            return result

        return collective

    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:
            continue
        patcher.patch(dist, name, make(name, original))


def _patch_init_process_group(session: Any, patcher: Any, dist: Any) -> None:
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            data = rank_data(session)
            data["rank"] = dist.get_rank()
            data["world_size"] = dist.get_world_size()
            data["backend"] = str(dist.get_backend())
        except Exception as error:  # noqa: BLE001 - observer rule
            session.internal_error("init_process_group record", error)
        return result

    patcher.patch(dist, "init_process_group", init_process_group)
