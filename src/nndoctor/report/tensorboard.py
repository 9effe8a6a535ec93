"""The TensorBoard reporter: the doctor's scalars and findings in an event file.

Written with TensorBoard's own record format and protos (no torch, no TensorFlow), so
``tensorboard --logdir DIR`` shows them next to the user's curves. A local folder is written
with ``RecordWriter`` on a plain file: TensorBoard's ``EventFileWriter`` opens files through
``tf.io.gfile``, whose lazy ``tensorboard.compat.tf`` imports TensorFlow when it is installed
(seconds of CPU, and TensorFlow's start-up log lines in a PyTorch user's output). A URL
(``gs://``, ``s3://``) still goes through ``EventFileWriter``, whose gfile can write there.

* scalars under ``nndoctor/``: ``loss``, ``grad_norm/total`` and ``grad_norm/<layer>``,
  ``update_ratio/<layer>``, ``input/<min|max|mean|std>``, ``activations/relu_zero/<layer>``,
  ``activations/saturated/<layer>``, ``step_time_s``, ``data_wait_s``;
* text: ``nndoctor/findings/<CODE>`` at the step each finding first appeared, and
  ``nndoctor/report`` (every finding as a Markdown table) at the last step.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import time
from typing import Any

from nndoctor.core.findings import Finding, Report


def _writer_parts() -> tuple[Any, Any, Any]:
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb
    except ModuleNotFoundError:
        raise RuntimeError("--tensorboard needs the tensorboard package (pip install tensorboard)") from None
    return event_pb2, summary_pb2, text_pb


_file_numbers = itertools.count()


class LocalEventWriter:
    """``EventFileWriter``'s file (the same name pattern, first event and records) in a local
    folder, written synchronously through a plain file."""

    def __init__(self, logdir: str, event_pb2: Any, filename_suffix: str = "") -> None:
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._logdir = logdir
        os.makedirs(logdir, exist_ok=True)
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
                f"{next(_file_numbers)}{filename_suffix}")
        self._records = RecordWriter(open(os.path.join(logdir, name), "wb"))  # noqa: SIM115 - closed in close()
        self.add_event(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2",
                                       source_metadata=event_pb2.SourceMetadata(writer="nndoctor")))

    def add_event(self, event: Any) -> None:
        self._records.write(event.SerializeToString())

    def get_logdir(self) -> str:
        return self._logdir

    def close(self) -> None:
        self._records.close()


def _event_writer(logdir: str, event_pb2: Any) -> Any:
    if "://" in logdir:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        return EventFileWriter(logdir, filename_suffix=".nndoctor")
    return LocalEventWriter(logdir, event_pb2, filename_suffix=".nndoctor")


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
    event_pb2, summary_pb2, text_pb = _writer_parts()
    writer = _event_writer(os.fspath(logdir), event_pb2)
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
