"""``nndoctor perf`` under torchrun: DDP's own settings as ``--try`` changes, every re-run a re-run
of the whole job (all ranks), and one report for all ranks.

- **Changes** (injected into the user's unchanged ``DistributedDataParallel(...)`` call by
  patching its ``__init__`` in the re-run): ``ddp-bucket-view`` (``gradient_as_bucket_view=True``:
  the gradients are views into the all-reduce buckets, no copy either way), ``ddp-static-graph``
  (``static_graph=True``: the used parameters and bucket order are found once, not every step),
  ``ddp-bucket-cap`` (``bucket_cap_mb``, sized from the model's gradients by
  ``ddp_comm.bucket_cap_for``), ``ddp-no-sync`` (gradient accumulation: the all-reduce runs on the
  last backward before each optimizer step only, as ``with model.no_sync():`` does).
- **Re-runs of all ranks**: rank 0 schedules the trials as on one process; each re-run is
  published on torchrun's own rendezvous store, every rank starts its re-run of the script
  with the same change, window and a fresh rendezvous port (rank 0's re-run hosts it), and
  posts its timing; the re-run's step time is the slowest rank's.
- **One report**: every rank posts its report part and its step/communication numbers to the
  store at the end; rank 0 merges them (``distributed/merge.py``) and alone prints and writes.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import socket
import time
from datetime import timedelta
from typing import Any

from nndoctor.run.distributed.context import RankInfo

BUCKET_CAP_ENV = "NNDOCTOR_DDP_BUCKET_CAP_MB"
STORE_TIMEOUT_S = float(os.environ.get("NNDOCTOR_STORE_TIMEOUT", "30"))
FINAL_TIMEOUT_S = float(os.environ.get("NNDOCTOR_GATHER_TIMEOUT", "120"))
POLL_S = 0.1


# -- injection (in the re-run) ---------------------------------------------------------------------
class DdpInjection:
    """Patches ``DistributedDataParallel.__init__`` for the re-run's changes; ``undo`` restores it."""

    OVERRIDES = {"ddp-bucket-view": "gradient_as_bucket_view", "ddp-static-graph": "static_graph",
                 "ddp-bucket-cap": "bucket_cap_mb"}

    def __init__(self, changes: frozenset[str], applied: list[str], notes: list[str]) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.applied, self.notes = applied, notes
        self.overrides: dict[str, Any] = {}
        for change, keyword in self.OVERRIDES.items():
            if change in changes:
                self.overrides[keyword] = (float(os.environ.get(BUCKET_CAP_ENV) or 100.0)
                                           if keyword == "bucket_cap_mb" else True)
        self.no_sync = "ddp-no-sync" in changes
        self._accumulation: int | None = None  # forwards per optimizer step, from the last step
        self._forwards = 0
        self._models: list[Any] = []
        self._cls = DistributedDataParallel
        self._original = original = DistributedDataParallel.__init__
        signature = inspect.signature(original)
        injection = self

        @functools.wraps(original)
        def patched_init(ddp_self: Any, *args: Any, **kwargs: Any) -> None:
            bound = signature.bind(ddp_self, *args, **kwargs)
            name = type(bound.arguments.get("module")).__name__
            for keyword, value in injection.overrides.items():
                before = bound.arguments.get(keyword, signature.parameters[keyword].default)
                if keyword == "bucket_cap_mb" and before is None:
                    before = 25.0
                if before == value:
                    injection.notes.append(f"{keyword}={value!r} already")
                    continue
                bound.arguments[keyword] = value
                injection.applied.append(f"{keyword}={value!r} on DistributedDataParallel({name})")
            original(*bound.args, **bound.kwargs)
            if injection.no_sync:
                injection._models.append(ddp_self)
                ddp_self.register_forward_pre_hook(injection._before_forward)

        DistributedDataParallel.__init__ = patched_init  # type: ignore[method-assign,assignment]

    def _before_forward(self, module: Any, args: Any) -> None:
        import torch

        if not (module.training and torch.is_grad_enabled()):
            return
        self._forwards += 1
        k = self._accumulation
        # All but the last forward of an accumulation cycle skip the all-reduce (no_sync()).
        sync = not (k is not None and k > 1 and self._forwards < k)
        module.require_backward_grad_sync = sync
        if not sync and k is not None and not any(a.startswith("no_sync()") for a in self.applied):
            self.applied.append(f"no_sync() on {k - 1} of every {k} accumulation forwards/backwards of "
                                f"DistributedDataParallel({type(module.module).__name__})")

    def step_ended(self) -> None:
        if self.no_sync and self._forwards:
            self._accumulation = self._forwards
        self._forwards = 0

    def undo(self) -> None:
        self._cls.__init__ = self._original  # type: ignore[method-assign]
        if self.no_sync and self._accumulation is not None and not any(
                a.startswith("no_sync()") for a in self.applied):
            self.notes.append("one training forward per optimizer step: no accumulation to skip all-reduces in")


# -- the ranks' channel ------------------------------------------------------------------------------
class RankChannel:
    """Keys of torchrun's rendezvous store (the agent's TCPStore at MASTER_ADDR:MASTER_PORT),
    under a prefix of this launch and attempt: rank 0's trial commands, the ranks' results."""

    def __init__(self, info: RankInfo, store: Any) -> None:
        self.info, self.store = info, store
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = f"nndoctor-perf/{info.run_id}/{attempt}"

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.store.set(f"{self.prefix}/{key}", json.dumps(value, ensure_ascii=False, default=str))

    def get(self, key: str) -> dict[str, Any] | None:
        full = f"{self.prefix}/{key}"
        if not self.store.check([full]):
            return None
        value: dict[str, Any] = json.loads(self.store.get(full))
        return value

    def wait(self, keys: list[str], deadline: float) -> tuple[str, dict[str, Any]] | None:
        """The first of ``keys`` to appear before ``deadline`` (time.monotonic), or None."""
        while True:
            for key in keys:
                value = self.get(key)
                if value is not None:
                    return key, value
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)


def open_channel(info: RankInfo) -> RankChannel | str:
    """The channel, or why there is none (the ranks then report apart, as plain runs)."""
    try:
        import torch.distributed as dist

        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=False)
        return RankChannel(info, store)
    except Exception as error:  # noqa: BLE001 - observer rule: every rank reports alone instead
        return f"{type(error).__name__}: {error}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def rerun_env(port: int, extra: dict[str, str]) -> dict[str, str]:
    """The re-run's environment on top of the rank's: a rendezvous of its own on ``port``
    (rank 0's re-run hosts the store there; torchrun's agent store stays the parent's)."""
    return {**extra, "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "False"}


def merge_rank_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One re-run of the job from each rank's re-run: the slowest rank's step time (DDP ranks wait
    for each other every step), rank 0's loss and changes; the first error of any rank."""
    for rank, run in enumerate(runs):
        if "error" in run:
            return {**run, "error": f"rank {rank}: {run['error']}"}
    merged = dict(runs[0])
    times = [r.get("seconds_per_step") for r in runs]
    if all(t is not None for t in times):
        merged["seconds_per_step"] = max(times)  # type: ignore[type-var]
        merged["rank_seconds_per_step"] = times
    return merged


class JobRerun:
    """Rank 0's re-run of the whole job: ``run(changes)`` publishes the command, re-runs rank 0's
    own script and collects the other ranks' results.

    Every rank's re-run is killed at the same deadline, the budget left plus a minute (at most
    ``child_timeout_s``): when one rank's re-run fails, the others may wait for it in a
    collective (NCCL's own timeout is 10 minutes), and the next re-run must start on every rank."""

    def __init__(self, channel: RankChannel, run_child: Any, child_timeout_s: float,
                 time_left: Any = None) -> None:
        self.channel, self._run_child, self.timeout = channel, run_child, child_timeout_s
        self.time_left = time_left
        self.seq = 0

    def run(self, changes: list[str], warmup: int, steps: int, min_steps: int | None,
            env: dict[str, str]) -> dict[str, Any]:
        self.seq += 1
        timeout = self.timeout
        if self.time_left is not None:
            timeout = min(timeout, max(60.0, self.time_left() + 60.0))
        command = {"changes": changes, "warmup": warmup, "steps": steps, "min_steps": min_steps,
                   "env": rerun_env(free_port(), env), "timeout_s": timeout}
        started = time.monotonic()
        self.channel.put(f"cmd/{self.seq}", command)
        runs = [self._run_child(changes, warmup, steps, min_steps, command["env"], timeout)]
        deadline = started + timeout + 30.0
        for rank in range(1, self.channel.info.world_size):
            found = self.channel.wait([f"result/{self.seq}/{rank}"], deadline)
            runs.append(found[1] if found else {"error": "no result from this rank's re-run in time"})
        return merge_rank_runs(runs)

    def done(self) -> None:
        self.channel.put("done", {"after": self.seq})


def follow(channel: RankChannel, run_child: Any, deadline: float) -> int:
    """A rank other than 0: re-run the script as rank 0 commands until it says done (or the
    deadline passes: rank 0 is gone). Returns the number of re-runs."""
    seq = 0
    while True:
        found = channel.wait([f"cmd/{seq + 1}", "done"], deadline)
        if found is None or found[0] == "done":
            return seq
        seq += 1
        command = found[1]
        try:
            result = run_child(command["changes"], command["warmup"], command["steps"], command.get("min_steps"),
                               command["env"], command.get("timeout_s"))
        except Exception as error:  # noqa: BLE001 - reported to rank 0 as this rank's failure
            result = {"error": f"{type(error).__name__}: {error}"}
        channel.put(f"result/{seq}/{channel.info.rank}", result)


# -- one report -----------------------------------------------------------------------------------
def rank_summary(rank: int, perf: dict[str, Any]) -> dict[str, Any]:
    breakdown = perf.get("breakdown") or {}
    comm = perf.get("communication") or {}
    return {"rank": rank, "median_step_s": breakdown.get("median_step_s"), "steps": breakdown.get("steps"),
            "samples_per_s": breakdown.get("samples_per_s"),
            "communication": {k: comm.get(k) for k in ("all_reduce_s_per_step", "exposed_s_per_step",
                                                       "overlapped_fraction") if k in comm}}


def merge_perf(own: dict[str, Any], summaries: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """Rank 0's perf section with every rank's step and all-reduce time, and the slowest rank."""
    merged = dict(own)
    ranks = sorted(summaries, key=lambda s: s["rank"])
    merged["ranks"] = ranks
    timed = [s for s in ranks if s.get("median_step_s")]
    if timed:
        slowest = max(timed, key=lambda s: s["median_step_s"])
        merged["slowest_rank"] = slowest["rank"]
        merged["slowest_step_s"] = slowest["median_step_s"]
    merged["missing_ranks"] = [r for r in range(world_size) if r not in {s["rank"] for s in ranks}]
    return merged


def publish_final(channel: RankChannel, part: dict[str, Any], summary: dict[str, Any]) -> None:
    channel.put(f"final/{channel.info.rank}", {"part": part, "summary": summary})


def gather_final(channel: RankChannel, timeout_s: float = FINAL_TIMEOUT_S) -> list[dict[str, Any]]:
    """Every rank's final post (rank 0's included), waiting up to ``timeout_s`` for the others."""
    deadline = time.monotonic() + timeout_s
    found: list[dict[str, Any]] = []
    for rank in range(channel.info.world_size):
        got = channel.wait([f"final/{rank}"], deadline)
        if got is not None:
            found.append(got[1])
    return found
