"""--stall-action stop under torchrun when every rank hangs (a rank-conditional collective that
gloo, like NCCL, waits on): one merged report from the ranks' watchdog snapshots, with X110
from their flight records, although no rank reaches the end of the script."""

from __future__ import annotations

import pytest

from tests import childproc
from tests.distributed.test_torchrun import torchrun

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_both_ranks_stopped_in_native_code_still_give_one_merged_report(tmp_path):
    # The script ignores SIGINT, so the watchdog cannot interrupt the ranks' main threads (as in
    # native code under NCCL): it must end each rank with os._exit(124). Were SIGINT handled, a
    # rank would wait the watchdog's whole grace for its main thread (10 s by default) first:
    # 4 s, scaled to the machine's load, bound that.
    grace = {"NNDOCTOR_STOP_GRACE": f"{childproc.scaled(4.0):.1f}"}
    result, report = torchrun(tmp_path, "rank_conditional_all_reduce_hang.py", "--stall-seconds", "2",
                              "--stall-action", "stop", script_args=["ignore-sigint"], env_extra=grace)
    assert report is not None, result.stderr[-3000:]
    assert "exitcode  : 124" in result.stderr and result.returncode != 0
    assert report["status"] == "stalled"
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1] and report["missing_ranks"] == []
    stalls = [f for f in report["findings"] if f["code"] == "R104"]
    assert sorted(r for f in stalls for r in f["ranks"]) == [0, 1]
    [mismatch] = [f for f in report["findings"] if f["code"] == "X110"]
    assert mismatch["ranks"] == [0, 1] and mismatch["location"]["line"] == 30
    assert mismatch["evidence"]["source"] == "flight records"
    assert "rank 0 was in all_reduce of 1 element (float32) at " in mismatch["message"]
    assert "rank_conditional_all_reduce_hang.py:30 (step 3) while rank 1 was in barrier at " in mismatch["message"]
    assert "rank_conditional_all_reduce_hang.py:31 (step 3)" in mismatch["message"]
    # Printed once, by rank 0, before the ranks stopped.
    assert result.stderr.count("X110 collective-mismatch") == 1
    assert "SIGINT is ignored in this process" in result.stderr  # the other may be stopped by torchrun
