"""Merging per-rank parts into one report: a finding lists the ranks it occurred on.

Findings of different ranks with the same code and place become one finding with
``ranks: [0, 1]``, a summed count and the earliest step; each rank's own report stays
available under ``ranks`` in the JSON. Checks that compare ranks (same batches, diverged
parameters, one path written by several ranks) run here, on the numbers each rank recorded.
"""

from __future__ import annotations

from typing import Any

from nndoctor.core.findings import Finding, InternalError, Location, Report, Severity

_STATUS_ORDER = ("crashed", "interrupted", "stopped", "completed")


def finding_from_json(data: dict[str, Any]) -> Finding:
    location = data.get("location")
    return Finding(
        code=data["code"],
        name=data["name"],
        severity=Severity.parse(data["severity"]),
        message=data["message"],
        fix=data["fix"],
        location=Location(location["path"], location.get("line")) if location else None,
        evidence=dict(data.get("evidence") or {}),
        count=int(data.get("count", 1)),
        first_step=data.get("first_step"),
        ranks=data.get("ranks"),
    )


def merge_findings(target: Report, parts: list[dict[str, Any]]) -> None:
    """Add every part's findings to ``target``, merged by code and place across ranks."""
    merged: dict[tuple[str, Location | None], Finding] = {}
    order: list[Finding] = []
    for part in parts:
        rank = part.get("rank")
        for data in part["report"].get("findings", []):
            finding = finding_from_json(data)
            ranks: list[Any] = finding.ranks if finding.ranks is not None else [rank]
            existing = merged.get(finding.merge_key)
            if existing is None:
                finding.ranks = sorted(set(ranks))
                merged[finding.merge_key] = finding
                order.append(finding)
                continue
            existing.count += finding.count
            existing.ranks = sorted(set(existing.ranks or []) | set(ranks))
            if finding.first_step is not None and (
                existing.first_step is None or finding.first_step < existing.first_step
            ):
                existing.first_step = finding.first_step
            if finding.severity > existing.severity:
                existing.severity, existing.message, existing.evidence = (
                    finding.severity, finding.message, finding.evidence)
    for finding in order:
        target.findings.append(finding)


def merged_status(parts: list[dict[str, Any]]) -> str:
    # A rank that died without Python (SIGKILL, SIGABRT, a segfault) crashed the run.
    statuses = {"crashed" if p["report"].get("status") == "died" else p["report"].get("status", "completed")
                for p in parts}
    return next((s for s in _STATUS_ORDER if s in statuses), "completed")


def merge_parts(parts: list[dict[str, Any]], *, command: list[str], world_size: int,
                select: list[str], ignore: list[str]) -> Report:
    """One report for a whole launch, from the parts of the ranks that wrote one."""
    report = Report(command=list(command))
    report.status = merged_status(parts) if parts else "interrupted"
    report.steps = max((int(p["report"].get("steps", 0)) for p in parts), default=0)
    merge_findings(report, parts)
    attach_cross_rank(report, parts, select, ignore)
    for part in parts:
        rank = part.get("rank")
        body = part["report"]
        for error in body.get("internal_errors", []):
            report.internal_errors.append(InternalError(
                where=f"rank {rank}: {error.get('where', '')}", error=error.get("error", ""),
                traceback=error.get("traceback", "")))
        if body.get("traceback") and report.traceback is None:
            report.traceback = f"(rank {rank})\n{body['traceback']}"
        code = body.get("exit_code")
        if code and report.exit_code is None:
            report.exit_code = code
    # The first rank's crash that Python saw stands for the run's (the no-known-cause block).
    crash = next(((p["report"].get("extra") or {}).get("crash") for p in parts
                  if (p["report"].get("extra") or {}).get("crash")), None)
    if crash:
        report.extra["crash"] = crash
    ranks_present: set[Any] = {p.get("rank") for p in parts}
    present = sorted(ranks_present)
    report.distributed = {
        "world_size": world_size,
        "missing_ranks": [r for r in range(world_size) if r not in present],
        "ranks": [rank_detail(p) for p in parts],
    }
    dead = [{"rank": p.get("rank"), "pid": p.get("pid"), "host": p.get("host"), **p["died"]}
            for p in parts if p.get("died")]
    if dead:
        report.distributed["dead_ranks"] = dead
    return report


def attach_children(report: Report, parts: list[dict[str, Any]], select: list[str],
                    ignore: list[str]) -> None:
    """Fold the parts of processes a script started (mp.spawn, mp.Process) into its report."""
    if not parts:
        return
    merge_findings(report, parts)
    attach_cross_rank(report, parts, select, ignore)
    for part in parts:
        for error in part["report"].get("internal_errors", []):
            report.internal_errors.append(InternalError(
                where=f"child rank {part.get('rank')}: {error.get('where', '')}",
                error=error.get("error", ""), traceback=error.get("traceback", "")))
    report.steps = max([report.steps] + [int(p["report"].get("steps", 0)) for p in parts])
    report.distributed = {
        "world_size": max((p.get("world_size") or 0 for p in parts), default=0) or len(parts),
        "children": True,
        "ranks": [rank_detail(p) for p in parts],
    }


def attach_cross_rank(report: Report, parts: list[dict[str, Any]], select: list[str],
                      ignore: list[str]) -> None:
    """Run the checks that compare ranks over what each rank recorded."""
    if len(parts) < 2:
        return
    from nndoctor.checks.distributed import cross_rank_findings

    try:
        findings = cross_rank_findings(parts, select, ignore)
    except Exception as error:  # noqa: BLE001 - observer rule: a broken comparison is ours
        import traceback

        report.internal_errors.append(InternalError(
            where="cross-rank checks", error=f"{type(error).__name__}: {error}",
            traceback="".join(traceback.format_exception(type(error), error, error.__traceback__))))
        return
    for finding in findings:
        report.add(finding)


def rank_detail(part: dict[str, Any]) -> dict[str, Any]:
    body = part["report"]
    detail = {
        "rank": part.get("rank"),
        "pid": part.get("pid"),
        "host": part.get("host"),
        "status": body.get("status"),
        "steps": body.get("steps"),
        "findings": body.get("findings", []),
    }
    if body.get("exit_code") is not None:
        detail["exit_code"] = body["exit_code"]
    if body.get("traceback"):
        detail["traceback"] = body["traceback"]
    if part.get("died"):
        detail["signal"] = part["died"].get("signal")
    return detail
