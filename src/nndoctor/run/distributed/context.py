"""Which rank of which distributed launch this process is, read from the launcher's environment."""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from dataclasses import dataclass

from nndoctor.util.errors import UsageError


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a ``torchrun`` launch (the variables torch.distributed.run sets)."""

    rank: int
    world_size: int
    local_rank: int
    run_id: str

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def torchrun_rank(environ: dict[str, str] | None = None) -> RankInfo | None:
    """The rank when this process was started by torchrun (``TORCHELASTIC_RUN_ID`` is set only
    by its agent), else None. A plain ``RANK``/``WORLD_SIZE`` pair set by hand is not a launch."""
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" not in env:
        return None
    try:
        return RankInfo(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
            run_id=env["TORCHELASTIC_RUN_ID"],
        )
    except (KeyError, ValueError):
        return None


def parts_dir_for(run_id: str, launcher_pid: int) -> str:
    """The folder where the ranks of one launch leave their report parts.

    Keyed by the run id and the launcher's pid (every rank of a node is a child of the same
    torchrun agent), so two launches with the default run id ``none`` never mix their parts.
    ``NNDOCTOR_PARTS_DIR`` overrides it.
    """
    override = os.environ.get("NNDOCTOR_PARTS_DIR")
    if override:
        return override
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{user}-{run_id}-{launcher_pid}")
    return os.path.join(tempfile.gettempdir(), f"nndoctor-parts-{safe}")


# Launchers that start the training processes themselves: under `nndoctor run` they would be
# observed from outside, where no training happens.
_LAUNCHER_MODULES = {
    "torch.distributed.run": "torch.distributed.run",
    "torch.distributed.launch": "torch.distributed.launch",
    "accelerate.commands.launch": "accelerate launch",
    "deepspeed.launcher.runner": "deepspeed",
}
_LAUNCHER_SCRIPTS = {"torchrun", "accelerate", "deepspeed"}


def refuse_launcher(name: str, is_module: bool) -> None:
    """Raise a UsageError naming the supported form when the target is a process launcher."""
    if is_module:
        launcher = _LAUNCHER_MODULES.get(name)
    else:
        base = os.path.basename(name)
        launcher = base if base in _LAUNCHER_SCRIPTS or base.removesuffix(".exe") in _LAUNCHER_SCRIPTS else None
    if launcher is None:
        return
    raise UsageError(
        f"{launcher} starts the training processes itself, so nndoctor would observe none of them. "
        "Put nndoctor inside the launcher instead: "
        "torchrun --nproc_per_node N -m nndoctor run [OPTIONS] train.py [ARGS]"
    )


def parts_dir(info: RankInfo) -> str:
    """This rank's node folder for report parts: every rank of one node is a child of the same
    torchrun agent process."""
    return parts_dir_for(info.run_id, os.getppid())
