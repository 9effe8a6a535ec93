"""The GPU-only errors, explained from their real messages recorded once on the device GPU
(tests/fixtures/crash/recorded/README.md says how; E121 is quoted, not reproduced)."""

from __future__ import annotations

import pytest

from nndoctor.commands.explain.cli import explain_text
from tests.conftest import FIXTURES
from tests.snapshot import assert_findings_snapshot

RECORDED = FIXTURES / "crash" / "recorded"

CASES = {
    "E101_device_mismatch.txt": ("E101", "E101_device_mismatch.py", 9,
                                 lambda f: f.evidence["devices"] == ["cpu", "cuda:0"]
                                 and f.evidence["unassigned_move"] == "line 8: x.to(device)"),
    "E108_out_of_memory.txt": ("E108", "E108_out_of_memory.py", 7,
                               lambda f: f.evidence["requested"] == "256.00 GiB"
                               and "larger than the whole GPU" in f.message),
    "E109_device_side_assert.txt": ("E109", "E109_device_side_assert.py", 9,
                                    lambda f: f.evidence["kernel_assertion"] == "t >= 0 && t < n_classes"
                                    and "class target outside [0, C)" in f.message),
    "E116_cuda_in_forked_worker.txt": ("E116", "E116_cuda_in_forked_worker.py", 11,
                                       lambda f: ".cuda()" in f.message and "__getitem__" in f.message),
    "E120_invalid_device_ordinal.txt": ("E120", "E120_invalid_device_ordinal.py", 5,
                                        lambda f: "asks for 7" in f.message),
    "E121_cudnn_failure.quoted.txt": ("E121", "train.py", 72,
                                      lambda f: f.evidence["status"] == "CUDNN_STATUS_INTERNAL_ERROR"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_message_is_explained(name):
    code, script, line, key = CASES[name]
    findings, unexplained = explain_text((RECORDED / name).read_text())
    assert not unexplained
    assert [f.code for f in findings] == [code]
    finding = findings[0]
    assert finding.location.path.endswith(script) and finding.location.line == line
    assert key(finding), (finding.message, finding.evidence)
    # The paths in a recorded message are the recording machine's, fixed in the file: kept.
    assert_findings_snapshot(f"explain/{name.removesuffix('.txt')}", findings, local_paths=False,
                             source=f"nndoctor explain {RECORDED.name}/{name}")


def test_every_gpu_only_code_has_a_recorded_message():
    codes = {CASES[name][0] for name in CASES if (RECORDED / name).exists()}
    assert {"E108", "E109", "E116", "E120", "E121"} <= codes
