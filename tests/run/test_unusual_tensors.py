"""Statistics never fail on tensors whose values cannot be read as a dense array: sparse (COO,
CSR), nested, complex, quantized and meta tensors are skipped (or summarised where supported),
never an internal error (D108/D109 used to call as_strided on SparseCPU)."""

from __future__ import annotations

import warnings

import pytest
import torch

from nndoctor.instrument.inputs_probe import (
    class_target_range,
    summarize_class_axis,
    summarize_samples,
)
from nndoctor.instrument.stats import first_plain_tensor, has_plain_values, summarize
from tests.conftest import FIXTURES, run_script

KINDS = ["sparse_coo", "sparse_csr", "nested", "complex", "quantized", "meta"]


def _make(kind: str) -> torch.Tensor:
    dense = torch.randn(8, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "sparse_coo": lambda: dense.to_sparse(),
            "sparse_csr": lambda: dense.to_sparse_csr(),
            "nested": lambda: torch.nested.nested_tensor([torch.randn(2 + i % 3, 4) for i in range(8)]),
            "complex": lambda: torch.randn(8, 16, dtype=torch.cfloat),
            "quantized": lambda: torch.quantize_per_tensor(torch.rand(8, 16), 0.01, 0, torch.quint8),
            "meta": lambda: torch.empty(8, 16, device="meta"),
        }[kind]()


@pytest.mark.parametrize("kind", KINDS)
def test_every_statistic_skips_tensors_without_plain_values(kind):
    tensor = _make(kind)
    assert summarize(tensor) is None
    assert summarize_samples(tensor) is None
    assert summarize_class_axis(tensor) is None
    assert class_target_range(torch.randn(8, 3), tensor, -100) is None
    if kind != "complex":  # complex values are readable; statistics that need order skip them
        assert class_target_range(tensor, torch.zeros(8, dtype=torch.long), -100) is None
        assert not has_plain_values(tensor) and first_plain_tensor((tensor, 1)) is None


def test_plain_tensors_are_still_summarised():
    assert has_plain_values(torch.randn(4, 4))
    stats = summarize(torch.arange(16.0).reshape(4, 4))
    assert stats is not None and stats.max == 15.0


@pytest.mark.parametrize("kind", KINDS)
def test_training_on_unusual_tensors_has_no_internal_error(kind):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = run_script(FIXTURES / "scripts" / "unusual_tensors.py", [kind])
    assert report.status == "completed", report.traceback
    assert report.steps > 0
    assert not report.internal_errors, [(e.where, e.error) for e in report.internal_errors]
