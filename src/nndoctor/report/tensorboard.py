"""The TensorBoard reporter: the doctor's scalars and findings in an event file.

Written with TensorBoard's own ``EventFileWriter`` (no torch, no TensorFlow), so
``tensorboard --logdir DIR`` shows them next to the user's curves:

* scalars under ``nndoctor/``: ``loss``, ``grad_norm/total`` and ``grad_norm/<layer>``,
  ``update_ratio/<layer>``, ``input/<min|max|mean|std>``, ``activations/relu_zero/<layer>``,
  ``activations/saturated/<layer>``, ``step_time_s``, ``data_wait_s``;
* text: ``nndoctor/findings/<CODE>`` at the step each finding first appeared, and
  ``nndoctor/report`` (every finding as a Markdown table) at the last step.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from nndoctor.findings import Finding, Report


def _writer_parts() -> tuple[Any, Any, Any, Any]:
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ModuleNotFoundError:
        raise RuntimeError("--tensorboard needs the tensorboard package (pip install tensorboard)") from None
    return EventFileWriter, event_pb2, summary_pb2, text_pb


def scalar_series(report: Report) -> dict[str, tuple[list[int], list[float]]]:
    """Tag -> (steps, values) of every scalar the history holds (finite values only)."""
    history = report.history
    if history is None:
        return {}
    found: dict[str, tuple[list[int], list[float]]] = {}

    def put(tag: str, series: Any) -> None:
        pairs = [(s, v) for s, v in zip(series.steps, series.values) if math.isfinite(v)]
        if pairs:
            found[f"nndoctor/{tag}"] = ([s for s, _ in pairs], [v for _, v in pairs])

    put("loss", history.loss)
    put("grad_norm/total", history.grad_norm_total)
    put("step_time_s", history.step_time)
    put("data_wait_s", history.data_wait)
    for prefix, layers in (("grad_norm", history.grad_norms), ("update_ratio", history.update_ratios),
                           ("input", history.inputs), ("activations/relu_zero", history.dead_fraction),
                           ("activations/saturated", history.saturated_fraction)):
        for name, series in layers.layers.items():
            put(f"{prefix}/{name}", series)
    return found


def finding_markdown(finding: Finding) -> str:
    where = f" at `{finding.location}`" if finding.location else ""
    evidence = "; ".join(f"{k}={v}" for k, v in finding.evidence.items() if not str(k).startswith("_"))
    lines = [f"**{finding.severity.label} {finding.code} {finding.name}**{where}", "", finding.message]
    if evidence:
        lines += ["", f"evidence: {evidence}"]
    lines += ["", f"fix: {finding.fix}"]
    return "\n".join(lines)


def report_markdown(report: Report) -> str:
    rows = ["| severity | code | name | where | first step | message |", "|---|---|---|---|---|---|"]
    for f in report.sorted_findings():
        message = f.message.replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {f.severity.label} | {f.code} | {f.name} | {f.location or ''} | "
                    f"{'' if f.first_step is None else f.first_step} | {message} |")
    if not report.findings:
        rows.append("| | | no problems found | | | |")
    if report.suppressed:
        rows += ["", f"{len(report.suppressed)} suppressed finding(s)."]
    return "\n".join(rows)


def write_tensorboard(report: Report, logdir: str | os.PathLike[str]) -> str:
    """Write one event file into ``logdir``; returns its path."""
    EventFileWriter, event_pb2, summary_pb2, text_pb = _writer_parts()
    os.makedirs(logdir, exist_ok=True)
    writer = EventFileWriter(str(logdir), filename_suffix=".nndoctor")
    now = time.time()
    try:
        for tag, (steps, values) in scalar_series(report).items():
            for step, value in zip(steps, values):
                summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
                writer.add_event(event_pb2.Event(wall_time=now, step=int(step), summary=summary))
        for finding in report.sorted_findings():
            step = finding.first_step if finding.first_step is not None else report.steps
            writer.add_event(event_pb2.Event(
                wall_time=now, step=int(step),
                summary=text_pb(f"nndoctor/findings/{finding.code}", finding_markdown(finding))))
        writer.add_event(event_pb2.Event(wall_time=now, step=int(report.steps),
                                         summary=text_pb("nndoctor/report", report_markdown(report))))
        path = writer.get_logdir()
    finally:
        writer.close()
    return path
