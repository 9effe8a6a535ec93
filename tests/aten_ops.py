"""The ATen operations a block of code dispatches, in order (on a GPU each is a kernel launch)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class RecordOps(TorchDispatchMode):
    """``with RecordOps() as recorded: ...`` then ``recorded.ops``: each operation's name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))
