"""R104 training-stalled and X110 collective-mismatch: what the stall watchdog reports.

The watchdog thread (``nndoctor.run.watchdog``) decides when a run stalled and gathers the
stacks; these classes are the catalog entries, the progress bookkeeping the watchdog reads,
and the cross-rank comparison of where each rank is blocked.
"""

from __future__ import annotations

from typing import Any

from nndoctor.checks.distributed import CrossRankCheck
from nndoctor.core.findings import Finding, Location, Severity
from nndoctor.core.registry import Check, register


@register
class TrainingStalled(Check):
    """
    ## What it does
    A watchdog thread notes every optimizer step, batch and forward. When none happened for
    `--stall-seconds` (default 300; 0 disables; also `NNDOCTOR_STALL_SECONDS`), it prints the
    stack of every thread with your frames marked `>>`, reports where the main thread is
    blocked (and in which `torch.distributed` collective, if any), writes the JSON report and
    keeps waiting — or, with `--stall-action stop`, stops the run. It arms at the first batch,
    forward or step (or when a collective is entered), so long setup is not a stall.

    ## Why is this bad?
    A hung run burns its GPU allocation and says nothing: a DataLoader worker deadlock, a
    collective one rank never joins, a lock or a blocking read. The stack at the moment of the
    hang is what tells which.

    ## Example
    ```python
    if dist.get_rank() == 0:
        dist.all_reduce(metric)        # rank 1 never calls it: rank 0 waits forever
    ```

    ## Use instead
    Call every collective on every rank, in the same order; give DataLoader workers
    timeouts (`DataLoader(..., timeout=...)`) and avoid locks shared with forked workers.

    ## References
    - PyTorch docs, torch.distributed (collectives must be called by all ranks of the group):
      https://pytorch.org/docs/stable/distributed.html#collective-functions
    - Python docs, faulthandler.dump_traceback_later (the same idea for one process):
      https://docs.python.org/3/library/faulthandler.html
    """

    code = "R104"
    name = "training-stalled"
    severity = Severity.ERROR
    summary = "no step/batch/forward for `--stall-seconds`: stacks of every thread (and rank)"
    fix = "see where each thread (and rank) is blocked in the stacks printed above the report"
    needs = frozenset({"stall_watchdog"})

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self._state = session.state
        # Installed for X110 alone: the watchdog runs and notes progress, R104 reports nothing.
        self.silent = False

    # Progress is counted by the instrumentation in the run state (batches fetched, root
    # forwards, finished backward passes, optimizer steps): no handler call on any step. The
    # watchdog thread notes when the count last moved, so a stall is seen at most one poll
    # interval late, and no clock is read on the training thread.
    @property
    def beats(self) -> int:
        state = self._state
        return state.batches_fetched + state.forwards + state.backwards_done + state.total_steps

    @property
    def last_kind(self) -> str:
        return self._state.last_progress

    @property
    def armed(self) -> bool:
        """Armed at the first batch, forward, backward or step: long setup is not a stall."""
        return self.beats > 0


def _where(record: dict[str, Any]) -> str:
    collective = record.get("collective")
    if collective:
        return f"in {collective} at {record.get('collective_location') or record.get('location')}"
    return f"at {record.get('location')} (not in a collective)"


def blocked_positions(parts: list[dict[str, Any]]) -> dict[int, dict[str, Any] | None]:
    """rank -> its stall record (None: the rank did not stall, e.g. it finished)."""
    return {p["rank"]: (p.get("data") or {}).get("stall") for p in parts}


@register
class CollectiveMismatch(CrossRankCheck):
    """
    ## What it does
    When the stall watchdog fires in a distributed run, every rank records the collective it
    is blocked in (from the `torch.distributed` call in your code) and the line; the records
    are compared across ranks. Ranks blocked in different collectives or at different lines,
    or one rank waiting in a collective that another rank already left (it finished or is
    elsewhere), are reported with the line of each rank. Under `torchrun` each rank's flight
    record (the last collective it entered: op, element count, dtype, line) is compared too, so
    a mismatch is named even when every rank hangs outside Python's view (NCCL returns at once
    and the GPU waits) or a rank died; with `--stall-action stop` rank 0 delivers this merged
    report before the ranks are stopped.

    ## Why is this bad?
    Every rank must call the same collectives in the same order. A collective inside
    `if rank == 0:` (logging a metric, saving) or a different number of batches per rank makes
    one rank wait forever: the job hangs until the NCCL/gloo timeout, often 10–30 minutes.

    ## Example
    ```python
    if dist.get_rank() == 0:
        dist.all_reduce(loss_sum)
    ```

    ## Use instead
    ```python
    dist.all_reduce(loss_sum)          # on every rank
    if dist.get_rank() == 0:
        print(loss_sum.item())
    ```

    ## References
    - PyTorch docs, torch.distributed collective functions: https://pytorch.org/docs/stable/distributed.html#collective-functions
    - PyTorch docs, TORCH_DISTRIBUTED_DEBUG / monitored_barrier for debugging hangs: https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications
    """

    code = "X110"
    name = "collective-mismatch"
    severity = Severity.ERROR
    summary = "ranks in different collectives / a rank-conditional collective (hang)"
    fix = "call every collective on every rank in the same order (no collective inside `if rank == ...`)"
    needs = frozenset({"stall_watchdog"})

    @classmethod
    def compare(cls, parts: list[dict[str, Any]]) -> list[Finding]:
        # The flight records say more (op, element count, dtype, step) when the ranks were in
        # different collectives; the stall records also catch a rank that was in none.
        return cls._from_flight_records(parts) or cls._from_stalls(parts)

    @classmethod
    def _from_flight_records(cls, parts: list[dict[str, Any]]) -> list[Finding]:
        """A run that ended with a failed rank, or whose every rank stalled: the collective each
        rank was last in, from the flight records (nndoctor.run.distributed.flight), differs between
        ranks."""
        from nndoctor.run.distributed.positions import (
            collective_key,
            describe_position,
            last_collectives,
            location_of,
        )

        if all(p["report"].get("status") in ("completed", "stopped") for p in parts):
            return []
        flights = {p["rank"]: (p.get("data") or {}).get("flight") for p in parts}
        keys: dict[int, Any] = {r: collective_key(f) for r, f in flights.items() if f and collective_key(f)}
        stalled = all((p.get("data") or {}).get("stall") for p in parts)
        location = None
        if len(set(keys.values())) < 2:
            waiting = any((f or {}).get("in_collective") for f in flights.values())
            keys = last_collectives(flights) if stalled and not waiting else {}
            if len(set(keys.values())) < 2:
                return []
            # Every rank hung outside a collective (NCCL returns at once and the GPU waits):
            # the rank that entered a collective the others did not is where they diverged.
            extra = max(keys, key=lambda r: int((flights[r] or {}).get("collectives") or 0))
            location = location_of({**(flights[extra] or {}), "in_collective": True})
        described = " while ".join(
            f"rank {r} was {describe_position(flights[r])}" for r in sorted(keys))
        first = min(r for r in keys if (flights[r] or {}).get("in_collective")) if any(
            (flights[r] or {}).get("in_collective") for r in keys) else min(keys)
        died = {p["rank"]: p["died"].get("signal") for p in parts if p.get("died")}
        ending = "; ".join(f"rank {r} then died of {sig}" for r, sig in sorted(died.items()))
        when = "when every rank stalled" if stalled else "when the run failed"
        opening = (f"The ranks' last collectives differ {when}" if location is not None
                   else f"The ranks were in different collectives {when}")
        finding = cls.finding(
            f"{opening}: {described}"
            f"{' (' + ending + ')' if ending else ''}. Every rank must call the same collectives "
            "in the same order; a collective that only some ranks call (for example inside "
            "`if rank == 0:`) is paired with a different one on the other ranks and fails or hangs.",
            location=location or location_of(flights[first]),
            evidence={"positions": {str(r): describe_position(flights[r]) for r in sorted(keys)},
                      "source": "flight records", **({"died": {str(r): s for r, s in died.items()}} if died else {})},
        )
        finding.ranks = sorted(keys)
        finding.first_step = min(int((flights[r] or {}).get("step") or 0) for r in keys)
        return [finding]

    @classmethod
    def _from_stalls(cls, parts: list[dict[str, Any]]) -> list[Finding]:
        positions = blocked_positions(parts)
        stalled = {r: rec for r, rec in positions.items() if rec}
        in_collective = {r: rec for r, rec in stalled.items() if rec.get("collective")}
        if not in_collective or len(positions) < 2:
            return []
        keys = {r: (rec.get("collective"), rec.get("collective_location") or rec.get("location"))
                if rec else None for r, rec in positions.items()}
        if len(set(keys.values())) < 2:
            return []  # every rank in the same collective at the same line: not a mismatch
        described = "; ".join(f"rank {r} {_where(rec)}" if rec else f"rank {r} was not blocked (it finished or moved on)"
                              for r, rec in sorted(positions.items()))
        first_rank = min(in_collective)
        where = in_collective[first_rank].get("collective_location") or in_collective[first_rank].get("location")
        location = None
        if where and ":" in where:
            path, _, line = where.rpartition(":")
            location = Location(path, int(line) if line.isdigit() else None)
        finding = cls.finding(
            f"The ranks are blocked in different places, so none can proceed: {described}. A "
            "collective that not every rank calls (for example inside `if rank == 0:`) waits forever.",
            location=location,
            evidence={"positions": {str(r): (_where(rec) if rec else "not blocked") for r, rec in positions.items()},
                      "idle_s": max((rec.get("idle_s", 0) for rec in stalled.values()), default=0)},
        )
        finding.ranks = sorted(positions)
        finding.first_step = min((rec.get("step", 0) for rec in stalled.values()), default=None)
        return [finding]
