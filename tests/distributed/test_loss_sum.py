"""X106 on CPU: the graph analysis DataParallel's case relies on, on real autograd graphs.

On CPU (or one GPU) DataParallel calls the module directly and never gathers, so the buggy
path needs two GPUs: tests/checks/test_gpu_dataparallel_loss_sum.py runs it there. Here the
vector of per-device losses is built the way DataParallel's gather builds it (one 0-dim
loss per device, stacked) and annotated the way the gather hook annotates it; what the
check concludes comes from the real graph. The DDP case (all_reduce SUM) runs under gloo in
tests/fixtures/buggy/X101_ddp_shared_loader.py and tests/distributed/test_torchrun.py.
"""

from __future__ import annotations

import torch

from nndoctor.checks.loss_sum import summed_device_losses
from nndoctor.instrument.loss_sum import GATHERED_KEY, scalar_positions


def per_device_losses(devices: int = 2) -> torch.Tensor:
    weight = torch.nn.Parameter(torch.randn(8, 3))
    losses = [torch.nn.functional.cross_entropy(torch.randn(4, 8) @ weight, torch.randint(0, 3, (4,)))
              for _ in range(devices)]
    vector = torch.stack(losses)
    vector.grad_fn.metadata[GATHERED_KEY] = {"devices": devices, "shape": [devices], "path": "t.py", "line": 3}
    return vector


def test_sum_of_gathered_losses_is_found_with_its_factor():
    found = summed_device_losses(per_device_losses(4).sum().grad_fn)
    assert found is not None and found["devices"] == 4 and found["multiplier"] == 1.0


def test_mean_is_not_a_sum():
    assert summed_device_losses(per_device_losses().mean().grad_fn) is None


def test_sum_divided_by_the_device_count_multiplies_back_to_one():
    found = summed_device_losses((per_device_losses(2).sum() / 2).grad_fn)
    assert found is not None and found["devices"] * found["multiplier"] == 1.0


def test_constant_scalings_after_the_sum_are_multiplied_and_the_scaler_removed():
    scale = torch.tensor(65536.0)
    found = summed_device_losses(((per_device_losses(2).sum() / 4) * scale).grad_fn, scaler_scale=65536.0)
    assert found["multiplier"] == 0.25 and found["scaler_removed"]
    found = summed_device_losses(((per_device_losses(2).sum() / 4) * scale).grad_fn)
    assert found["multiplier"] == 65536.0 / 4 and not found["scaler_removed"]


def test_a_sum_of_an_unannotated_vector_or_a_loss_mixed_with_parameters_is_not_reported():
    weight = torch.nn.Parameter(torch.ones(()))
    plain = torch.stack([weight * 2, weight * 3])
    assert summed_device_losses(plain.sum().grad_fn) is None
    assert summed_device_losses((per_device_losses().sum() * weight).grad_fn) is None  # both sides learn


def test_scalar_positions_follow_gathers_structure():
    a, b = torch.tensor(1.0), torch.tensor(2.0)
    stacked, logits = torch.stack([a, b]), torch.zeros(8, 3)
    assert scalar_positions([a, b], stacked) == [stacked]
    found = scalar_positions([{"loss": a, "logits": torch.zeros(4, 3)}, {"loss": b, "logits": torch.zeros(4, 3)}],
                             {"loss": stacked, "logits": logits})
    assert len(found) == 1 and found[0] is stacked
    assert scalar_positions([(a, torch.zeros(4)), (b, torch.zeros(4))], (stacked, torch.zeros(8)))[0] is stacked
    assert scalar_positions([torch.zeros(4), torch.zeros(4)], torch.zeros(8)) == []
    assert scalar_positions([torch.tensor(1), torch.tensor(2)], torch.tensor([1, 2])) == []  # integer counts
