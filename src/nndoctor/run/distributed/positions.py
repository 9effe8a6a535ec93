"""Where a rank was, in words, from its flight record (``nndoctor.run.distributed.flight``)."""

from __future__ import annotations

from typing import Any

from nndoctor.core.findings import Location


def collective_key(flight: dict[str, Any]) -> tuple[str, str] | None:
    """The collective the rank was in: (op, user line) of an explicit one, or DDP's gradient
    all-reduce during a backward of a DDP model; None when it was in none."""
    if flight.get("in_collective"):
        return flight.get("op") or "?", flight.get("location") or ""
    if flight.get("phase") == "backward" and flight.get("ddp"):
        return "DDP gradient all-reduce", flight.get("phase_location") or ""
    return None


def last_collectives(flights: dict[int, dict[str, Any] | None]) -> dict[int, tuple[Any, ...]]:
    """rank -> (collectives entered, the last one's op, element count, dtype, user line), for
    ranks that all hang outside any collective: equal on every rank unless one rank entered a
    collective the others did not (or a different one)."""
    return {r: (f.get("collectives"), f.get("op"), f.get("numel"), f.get("dtype"), f.get("location"))
            for r, f in flights.items() if f}


def describe_position(flight: dict[str, Any] | None) -> str:
    """E.g. "in all_reduce of 1 element (float32) at train.py:25 (step 4)"."""
    if not flight:
        return "somewhere unknown (no flight record)"
    step = flight.get("step") or 0
    if flight.get("in_collective"):
        return f"in {_collective(flight)} (step {step})"
    phase, where = flight.get("phase"), flight.get("phase_location") or "an unknown line"
    if phase == "backward" and flight.get("ddp"):
        return f"in DDP's gradient all-reduce (the backward at {where}, step {step})"
    if phase == "backward":
        described = f"in the backward at {where} (step {step})"
    elif phase == "after backward":
        described = f"between the backward at {where} and optimizer step {step + 1}"
    elif phase == "after step":
        described = f"after optimizer step {step}"
    else:
        described = "before its first optimizer step"
    # NCCL collectives return at once (the GPU runs them later): the last one entered still
    # says what the rank was waiting for.
    if flight.get("op"):
        return f"{described}; its last collective was {_collective(flight)}"
    return f"{described}, in no collective"


def _collective(flight: dict[str, Any]) -> str:
    count = int(flight.get("numel") or 0)
    size = f" of {count} element{'s' if count != 1 else ''}" if flight.get("dtype") else ""
    dtype = f" ({flight['dtype']})" if flight.get("dtype") else ""
    return f"{flight.get('op')}{size}{dtype} at {flight.get('location') or 'an unknown line'}"


def location_of(flight: dict[str, Any] | None) -> Location | None:
    """The user line of the rank's position, as a Location."""
    if not flight:
        return None
    where = flight.get("location") if flight.get("in_collective") else (
        flight.get("phase_location") or flight.get("location"))
    if not where or ":" not in where:
        return None
    path, _, line = where.rpartition(":")
    return Location(path, int(line) if line.isdigit() else None)
