"""E130 and E132 need several ranks to happen: their real messages were recorded once from
``torchrun --standalone --nproc_per_node 2`` (gloo, CPU) running the scripts beside them in
tests/fixtures/crash/distributed/ (E132 with TORCH_DISTRIBUTED_DEBUG=DETAIL), unedited."""

from __future__ import annotations

import pytest

from nndoctor.commands.explain.cli import explain_text
from tests.conftest import FIXTURES
from tests.snapshot import assert_findings_snapshot

RECORDED = FIXTURES / "crash" / "distributed"

CASES = {
    "E130_collective_timeout.txt": ("E130", 12, lambda f: f.evidence["timeout_s"] == 3.0),
    "E132_shape_mismatch.txt": ("E132", 9, lambda f: f.evidence["rank_0"] == "ALLREDUCE [4]"
                                and f.evidence["rank_1"] == "ALLREDUCE [5]"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_distributed_crash_is_explained(name):
    code, line, key = CASES[name]
    findings, unexplained = explain_text((RECORDED / name).read_text())
    # torchrun's own ChildFailedError (the agent reporting the failed rank) carries no cause:
    # once the rank's cause is found it is not reported as an error of its own.
    assert unexplained == []
    assert [f.code for f in findings] == [code]
    assert findings[0].location.path.endswith(name.replace(".txt", ".py"))
    assert findings[0].location.line == line
    assert key(findings[0]), findings[0].evidence
    # The paths in a recorded message are the recording machine's, fixed in the file: kept.
    assert_findings_snapshot(f"explain/{name.removesuffix('.txt')}", findings, local_paths=False,
                             source=f"nndoctor explain crash/distributed/{name}")


def test_gloo_size_abort_is_a_shape_mismatch():
    from nndoctor.commands.explain.crash import Crash
    from nndoctor.commands.explain.distributed import CollectiveShapeMismatch

    # gloo's own enforce message (gloo/transport/tcp/pair.cc) when buffer sizes differ.
    crash = Crash(exc_type="RuntimeError", message="[enforce fail at pair.cc:446] op.preamble.length <= op.nbytes. 20 vs 16")
    facts = CollectiveShapeMismatch.match(crash)
    finding = CollectiveShapeMismatch.build(crash, facts)
    assert finding.evidence == {"bytes_received": 20, "bytes_expected": 16}
