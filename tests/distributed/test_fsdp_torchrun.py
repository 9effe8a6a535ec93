"""FSDP2 (`fully_shard`) under `torchrun ... -m nndoctor run` on 2 CPU processes (gloo): the
checks read DTensor parameters and gradients without internal errors and still find a bug."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests import childproc

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FIXTURES = Path(__file__).parent.parent / "fixtures" / "distributed"


def test_fsdp2_run_has_no_internal_error_and_finds_the_missing_zero_grad(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", NNDOCTOR_PARTS_DIR=str(tmp_path / "parts"))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "nndoctor", "run", "--json", str(tmp_path / "report.json"),
               str(FIXTURES / "fsdp2_missing_zero_grad.py")]
    result = childproc.run(command, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["internal_errors"] == []
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]
    codes = {f["code"]: f for f in report["findings"]}
    assert codes["O101"]["ranks"] == [0, 1] and codes["O101"]["location"]["line"] == 26  # the optimizer.step()
    assert not [f for f in report["findings"] if f["severity"] == "error" and f["code"] != "O101"]
