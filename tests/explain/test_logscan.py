"""Whole logs: causes read from lines that are not Python exceptions (``explain.logscan``),
warnings, launcher reports, and the rules that keep them from naming a wrong cause."""

from __future__ import annotations

import re
import time

import pytest

from nndoctor.commands.explain.base import explanations
from nndoctor.commands.explain.cli import explain_all, explain_text
from nndoctor.commands.explain.logscan import MIN_ANCHOR_CHARS, anchor, scan
from nndoctor.commands.explain.pasted import clean
from tests.explain.test_pasted_logs import PASTED, read_case


def test_every_log_wording_has_an_anchor_and_no_named_group():
    wordings = [(cls.code, w) for cls in explanations() for w in cls.log_lines + cls.warning_lines]
    assert len(wordings) >= 12
    for code, wording in wordings:
        assert anchor(wording) is not None and len(anchor(wording)) >= MIN_ANCHOR_CHARS, (code, wording)
        assert re.compile(wording).groupindex == {}, (code, wording)


def test_every_contradiction_belongs_to_warning_lines():
    for cls in explanations():
        for wording in cls.log_contradictions:
            assert cls.warning_lines, cls.code  # only a warning can be contradicted by the rest of the log
            re.compile(wording)


def test_a_warning_the_log_contradicts_is_not_reported():
    # Lightning prints its tensor-core note in bf16 runs too; the same note without the AMP line is P115.
    log = read_case(PASTED / "tf32_tensor_cores_note_under_bf16_amp.txt")[1]
    assert explain_text(log) == ([], [])
    findings, unexplained = explain_text(log.split("\n", 1)[1])
    assert [f.code for f in findings] == ["P115"] and findings[0].severity.label == "info" and not unexplained


def test_a_start_up_warning_does_not_explain_a_later_exception():
    # PyTorch's "sm_120 is not compatible" warning names V107 alone; a later KeyError is not a
    # missing kernel, while "no kernel image is available" in the exception itself still is V107.
    warning = read_case(PASTED / "v107_warning_only_container_fixed_by_cu128.txt")[1]
    findings, unexplained = explain_text(warning + "\nKeyError: 'label'\n")
    assert findings == [] and [c.exc_type for c in unexplained] == ["KeyError"]
    findings, unexplained = explain_text(
        warning + "\nRuntimeError: CUDA error: no kernel image is available for execution on the device\n")
    assert [f.code for f in findings] == ["V107"] and not unexplained


def test_anchor_is_the_literal_start_of_the_wording():
    assert anchor(r"Work WorkNCCL\(SeqNum=\d+") == "Work WorkNCCL(SeqNum="
    assert anchor(r"produced by an? [\w ]+") == "produced by a"  # the optional "n" ends it
    assert anchor(r"\d+ items") is None


def test_every_code_family_a_log_shows_has_an_explain_path():
    codes = {cls.code for cls in explanations()}
    assert {"K101", "K103", "K109", "P107", "P113", "P115", "X110", "V103", "V104", "V105", "V107", "V108", "E130", "E131",
            "E115"} <= codes


def test_a_warning_is_reported_only_when_the_log_holds_no_error():
    warning = read_case(PASTED / "dynamo_recompile_limit_warning_only.txt")[1]
    (finding,), unexplained = explain_text(warning)
    assert finding.code == "P113" and not unexplained
    assert finding.message.startswith("A warning in the log (log line 2) names this cause")
    assert finding.severity.label == "warning"  # the catalogued severity of P113
    assert finding.location is not None and finding.location.line == 4  # dynamo names the function's line
    # The same warning above an unrelated error: the error is what stopped the run.
    findings, unexplained = explain_text(warning + "\nKeyError: 'label'\n")
    assert [f.code for f in findings] == [] and [c.exc_type for c in unexplained] == ["KeyError"]


def test_a_line_counts_only_for_the_wording_written_for_it():
    # "Address already in use" from another program is not the rendezvous port (E131's wording
    # is c10d's own line), and a label count that is not rows × classes is not one-hot labels.
    findings, unexplained = explain_text("OSError: [Errno 98] Address already in use: ('0.0.0.0', 6006)\n")
    assert findings == [] and len(unexplained) == 1
    for text in ("InvalidArgumentError: logits and labels must have the same first dimension, "
                 "got logits shape [400,10000] and labels shape [420]",):
        findings, unexplained = explain_text(text)
        assert findings == [] and len(unexplained) == 1
    hits = scan(clean("tensorboard: E0101 Address already in use\nAddress already in use\n"), explanations())
    assert hits == []


def test_launcher_report_is_dropped_once_the_cause_is_found():
    log = read_case(PASTED / "collective_mismatch_allreduce_vs_broadcast.txt")[1]
    child = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
             "train.py FAILED\nRoot Cause (first observed failure):\n[0]:\n  exitcode  : 1 (pid: 9)\n")
    findings, unexplained = explain_text(log + "\n" + child)
    assert [f.code for f in findings] == ["X110"] and unexplained == []
    # Alone, it is an error with no known cause, never a guessed one.
    findings, unexplained = explain_text(child)
    assert findings == [] and [c.short_type for c in unexplained] == ["ChildFailedError"]


def test_log_line_findings_name_the_line_and_count_the_others():
    result = explain_all(read_case(PASTED / "nccl_watchdog_old_glog_1800s.txt")[1])
    (finding,) = result.findings
    assert finding.evidence["log_line"] == 1 and finding.evidence["log_lines_with_it"] == 5
    assert finding.evidence["timeout_s"] == 1800.0 and finding.evidence["operation"] == "ALLREDUCE"
    assert "(from log line 1 and 4 more lines, not a Python exception)" in finding.message


@pytest.mark.parametrize("repeat", [(500, 4000)])
def test_scanning_a_long_log_stays_linear(repeat):
    small_n, large_n = repeat
    line = ("[rank3]:[E1127 12:00:01.123456 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600001 "
            "milliseconds before timing out.\nEpoch 1: 10%|#   | 100/1000 loss 2.31 received `from_logits=True` "
            "Detected mismatch logits and labels must\n")

    def seconds(n: int) -> float:
        started = time.perf_counter()
        explain_text(line * n)
        return time.perf_counter() - started

    seconds(10)  # compile the patterns outside the timing
    small, large = seconds(small_n), seconds(large_n)
    assert large < max(small * 24, 0.5), (small, large)
