"""M109 spectral-norm-never-updated and M110 functional-dropout-in-eval: what stays silent."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from nndoctor.checks.eval_layers import (
    STALE_SIGMA_RATIO,
    spectral_norm_parts,
    stored_and_true_sigma,
)
from tests.conftest import FIXTURES, run_script

SCRIPT = FIXTURES / "scripts" / "eval_layers.py"


def test_fresh_hook_spectral_norm_is_stale_and_parametrization_is_not():
    torch.manual_seed(0)
    hook = nn.utils.spectral_norm(nn.Linear(20, 30))
    param = nn.utils.parametrizations.spectral_norm(nn.Linear(20, 30))
    (_, m, u, v), = spectral_norm_parts(hook)
    stored, true = stored_and_true_sigma(m, u, v)
    assert stored < STALE_SIGMA_RATIO * true
    (_, m, u, v), = spectral_norm_parts(param)
    stored, true = stored_and_true_sigma(m, u, v)
    assert stored == pytest.approx(true, rel=0.05)
    assert spectral_norm_parts(nn.Linear(3, 3)) == []


@pytest.mark.parametrize("variant, code", [
    ("sn_hook_trained_first", "M109"),
    ("sn_parametrization_eval_first", "M109"),
    ("dropout_follows_mode", "M110"),
    ("mc_dropout", "M110"),
])
def test_correct_variants_are_silent(variant, code):
    report = run_script(SCRIPT, [variant], select=[code])
    assert report.status == "completed", report.traceback
    assert not report.findings, [f.message for f in report.findings]
    assert not report.internal_errors
