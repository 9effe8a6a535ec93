"""Perf-only instrumentation: forward start times, host-to-device copies, host-device syncs.

Installed only when a subscriber needs the ``perf_timers`` probe: the perf recorder of a
perf session declares it (``instrument/extensions.py``), so plain ``nndoctor run`` never
patches these. Everything here passes straight through once the
measured window is over, so the ``--try`` experiments run uninstrumented.

Host-device syncs are counted where user code reads a device tensor back on the host:
``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``.to("cpu")``, ``bool()/float()/int()``
of a tensor and ``torch.cuda.synchronize()``. (``torch.cuda.set_sync_debug_mode`` would
also see syncs inside torch ops, but it reports through warnings it prints to the user's
stderr; left for later.)
"""

from __future__ import annotations

import functools
import sys
import time
from typing import TYPE_CHECKING, Any

from nndoctor.commands.perf.torch.recorder import PERF_RECORDER, PerfRecorder
from nndoctor.core.user_code import user_location

if TYPE_CHECKING:
    # The concrete PyTorch installation: the forward-start hook reads its module-call stack.
    from nndoctor.instrument.torch_hooks import Installation

_SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


def install(installation: Installation) -> None:
    recorder = installation.session.stash.get(PERF_RECORDER, None)  # only a perf session has one
    if recorder is None:
        return
    _install_forward_start(installation, recorder)
    _patch_syncs(installation, recorder)
    _patch_copies(installation, recorder)


def _live(installation: Installation, recorder: PerfRecorder) -> bool:
    return installation.session.active and not recorder.window_done


def _install_forward_start(installation: Installation, recorder: PerfRecorder) -> None:
    from torch.nn.modules import module as module_mod

    stack = installation._stack

    def forward_pre(module: Any, args: tuple) -> None:
        # torch_hooks' pre-hook ran first and pushed the module: depth 1 = top-level call.
        if len(stack) == 1 and stack[0] is module and _live(installation, recorder):
            recorder.forward_begin(module)
        return None

    handle = module_mod.register_module_forward_pre_hook(forward_pre)
    installation.patcher.on_undo(handle.remove)


def _patch_syncs(installation: Installation, recorder: PerfRecorder) -> None:
    import torch

    device_types = recorder.config.sync_device_types

    def make(name: str, original: Any) -> Any:
        @functools.wraps(original)
        def synced(self, *args, **kwargs):
            if not _live(installation, recorder) or self.device.type not in device_types:
                return original(self, *args, **kwargs)
            started = time.perf_counter()
            result = original(self, *args, **kwargs)
            seconds = time.perf_counter() - started
            location = user_location(sys._getframe(1)) if recorder.measuring() else None
            recorder.note_sync(f".{name.strip('_')}()", seconds, location)
            return result

        return synced

    for name in _SYNC_METHODS:
        original = getattr(torch.Tensor, name)
        installation.patcher.patch(torch.Tensor, name, make(name, original))

    original_synchronize = torch.cuda.synchronize

    @functools.wraps(original_synchronize)
    def synchronize(*args, **kwargs):
        if not _live(installation, recorder) or "cuda" not in device_types:
            return original_synchronize(*args, **kwargs)
        started = time.perf_counter()
        result = original_synchronize(*args, **kwargs)
        location = user_location(sys._getframe(1)) if recorder.measuring() else None
        recorder.note_sync("torch.cuda.synchronize()", time.perf_counter() - started, location)
        return result

    installation.patcher.patch(torch.cuda, "synchronize", synchronize)


def _patch_copies(installation: Installation, recorder: PerfRecorder) -> None:
    import torch

    device_types = recorder.config.sync_device_types

    def make(name: str, original: Any) -> Any:
        @functools.wraps(original)
        def copy(self, *args, **kwargs):
            if not _live(installation, recorder):
                return original(self, *args, **kwargs)
            started = time.perf_counter()
            result = original(self, *args, **kwargs)
            if result is not self and isinstance(result, torch.Tensor):
                source, target = self.device.type, result.device.type
                seconds = time.perf_counter() - started
                if source == "cpu" and target != "cpu":
                    recorder.add_outside_phase("h2d", seconds)
                elif source in device_types and target == "cpu" and source != "cpu":
                    location = user_location(sys._getframe(1)) if recorder.measuring() else None
                    recorder.note_sync(".to(cpu)", seconds, location)
            return result

        return copy

    for name in ("to", "cuda"):
        installation.patcher.patch(torch.Tensor, name, make(name, getattr(torch.Tensor, name)))
