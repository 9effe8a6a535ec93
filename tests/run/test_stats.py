"""The shared tensor statistics: fast path, NaN/Inf path, and reuse by identity."""

from __future__ import annotations

import math

import pytest
import torch

from nndoctor.instrument import stats
from nndoctor.instrument.stats import cached_stats, summarize


class _Event:
    def __init__(self) -> None:
        self.cache: dict = {}


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_finite_tensor_statistics_match_a_float64_reference(dtype):
    x = (torch.rand(6, 3, 9, 7, generator=_g()) * 255).to(dtype)
    x[0, 0, 0, :3] = 0
    s = summarize(x)
    ref = x.double()
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert s.min == pytest.approx(ref.min().item(), rel=tol)
    assert s.max == pytest.approx(ref.max().item(), rel=tol)
    assert s.mean == pytest.approx(ref.mean().item(), rel=tol)
    assert s.std == pytest.approx(ref.std(unbiased=False).item(), rel=tol)
    assert s.nonfinite == 0
    assert s.zero_fraction == pytest.approx((ref == 0).double().mean().item())
    assert s.channel_mean_dim1 == pytest.approx(ref.mean(dim=(0, 2, 3)).tolist(), rel=tol)
    assert s.channel_std_dim1 == pytest.approx(ref.std(dim=(0, 2, 3)).tolist(), rel=tol)
    assert s.channel_mean_last == pytest.approx(ref.mean(dim=(0, 1, 2)).tolist(), rel=tol)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_entries_are_counted_and_left_out_of_the_moments(bad):
    x = torch.arange(10, dtype=torch.float32)
    x[3] = bad
    x[7] = bad
    s = summarize(x)
    finite = torch.tensor([v for i, v in enumerate(range(10)) if i not in (3, 7)], dtype=torch.float64)
    assert s.nonfinite == 2
    assert (s.min, s.max) == (0.0, 9.0)
    assert s.mean == pytest.approx(finite.mean().item())
    assert s.std == pytest.approx(finite.std(unbiased=False).item())


def test_same_tensor_is_summarised_once_across_events(monkeypatch):
    calls = []
    real = stats.summarize
    monkeypatch.setattr(stats, "summarize", lambda t, *a, **k: calls.append(1) or real(t, *a, **k))
    x = torch.rand(4, 3, 8, 8, generator=_g(1))
    first = cached_stats(_Event(), "input0", x)
    again = cached_stats(_Event(), "input0", x)
    assert again is first and len(calls) == 1
    x.mul_(255)  # changed in place: the version counter moved, so it is summarised anew
    changed = cached_stats(_Event(), "input0", x)
    assert len(calls) == 2 and changed.max > 1
    other = cached_stats(_Event(), "input0", x.clone())
    assert len(calls) == 3 and other.max == pytest.approx(changed.max)


def test_the_reuse_cache_holds_no_tensor_alive():
    import gc
    import weakref

    x = torch.rand(3, 3)
    ref = weakref.ref(x)
    cached_stats(_Event(), "input0", x)
    del x
    gc.collect()
    assert ref() is None


class _StepEvent(_Event):
    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step


def test_a_buffer_refilled_through_numpy_is_summarised_again_next_step():
    import numpy as np

    buffer = np.zeros((4, 3), dtype=np.float32)
    tensor = torch.from_numpy(buffer)
    assert cached_stats(_StepEvent(1), "input0", tensor).max == 0
    buffer[:] = 7  # the version counter does not see writes through numpy
    assert cached_stats(_StepEvent(2), "input0", tensor).max == 7


def test_huge_float32_values_keep_finite_moments():
    x = torch.tensor([3e38, -3e38, 1.0, 2.0], dtype=torch.float32)
    s = summarize(x)
    ref = x.double()
    assert s.nonfinite == 0 and math.isfinite(s.std)
    assert s.std == pytest.approx(ref.std(unbiased=False).item(), rel=1e-6)
    assert s.mean == pytest.approx(ref.mean().item(), abs=1e25)
