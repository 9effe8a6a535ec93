"""The decision logic of the explanations, called directly (no training loop)."""

from __future__ import annotations

import ast

import pytest

from nndoctor.commands.explain.autograd import truth_value_use
from nndoctor.commands.explain.devices import devices_in_message
from nndoctor.commands.explain.dtypes import dtype_advice
from nndoctor.commands.explain.instrument import batch_note
from nndoctor.commands.explain.memory import (
    memory_accounting,
    memory_breakdown,
    memory_diagnosis,
    memory_facts,
)
from nndoctor.commands.explain.samples import indices_from_text
from nndoctor.commands.explain.shapes import (
    batch_size_cause,
    channel_layout,
    last_batch_size,
    linear_mismatch,
    size_difference_kind,
    target_range_cause,
)
from nndoctor.commands.explain.state import parse_state_dict_error, prefix_diagnosis


@pytest.mark.parametrize("shape, expected, got, layout", [
    ([8, 224, 224, 3], 3, 224, "channels_last"),
    ([224, 224, 3], 3, 224, "channels_last"),
    ([8, 1, 28, 28], 3, 1, "grayscale"),
    ([8, 4, 64, 64], 3, 4, "rgba"),
    ([8, 3, 28, 28], 1, 3, "rgb_for_gray"),
    ([8, 64, 16, 16], 128, 64, "layers"),
])
def test_channel_layout(shape, expected, got, layout):
    assert channel_layout(shape, expected, got) == layout


def test_linear_mismatch_recognises_unflattened_and_larger_feature_maps():
    cause, fix = linear_mismatch(14336, 7, 512, [4, 512, 7, 7])
    assert "never flattened" in cause and "in_features=25088" in fix
    cause, fix = linear_mismatch(4, 2048, 512, [4, 2048])
    assert "2×2" in cause and "AdaptiveAvgPool2d" in fix
    cause, _ = linear_mismatch(4, 100, 64, [4, 100])
    assert "in_features=64" in cause


def test_target_range_causes():
    assert "1-based" in target_range_cause(1, 10, 10)[0]
    assert "ignore_index=-1" in target_range_cause(-1, 3, 4)[1]
    assert "out_features=12" in target_range_cause(0, 11, 10)[1]
    # The cause completes "the model outputs C classes (valid targets 0..C-1) but …" (issue 28).
    assert target_range_cause(0, 6, 2)[0] == "the labels go up to 6"


def test_batch_size_causes():
    assert "batch × sequence" in batch_size_cause(64, 8, [64, 10], [8, 8])[0]
    assert "2× as many rows" in batch_size_cause(8, 4, [8, 3], [4])[0]
    assert "different batches" in batch_size_cause(3, 4, [3, 3], [4])[0]


def test_last_batch_size():
    assert last_batch_size(33, 32, False) == 1
    assert last_batch_size(33, 32, True) is None
    assert last_batch_size(64, 32, False) == 32


def test_size_difference_kind():
    assert size_difference_kind([3, 224, 224], [1, 224, 224]) == "color"
    assert size_difference_kind([224, 224, 3], [224, 224, 4]) == "color"
    assert size_difference_kind([3, 32, 32], [3, 375, 500]) == "size"
    assert size_difference_kind([3, 32, 32], [32, 32]) == "rank"


STATE_DICT_ERROR = '''Error(s) in loading state_dict for ResNet:
	Missing key(s) in state_dict: "conv1.weight", "fc.bias".
	Unexpected key(s) in state_dict: "module.conv1.weight", "module.fc.bias".
	size mismatch for fc.weight: copying a param with shape torch.Size([1000, 512]) from checkpoint, the shape in current model is torch.Size([10, 512]).'''


def test_state_dict_error_parsing_and_prefix_direction():
    parsed = parse_state_dict_error(STATE_DICT_ERROR)
    assert parsed["model"] == "ResNet"
    assert parsed["missing"] == ["conv1.weight", "fc.bias"]
    assert parsed["unexpected"] == ["module.conv1.weight", "module.fc.bias"]
    assert parsed["size_mismatch"] == [("fc.weight", "1000, 512", "10, 512")]
    assert prefix_diagnosis(parsed["missing"], parsed["unexpected"]) == ("saved", "module.")
    assert prefix_diagnosis(["module.a", "module.b"], ["a", "b"]) == ("model", "module.")
    assert prefix_diagnosis([], ["_orig_mod.module.a"]) == ("saved", "_orig_mod.module.")
    assert prefix_diagnosis(["a"], ["b"]) is None


def test_memory_diagnosis_from_allocator_numbers():
    message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which "
               "1.06 GiB is free. Including non-PyTorch memory, this process has 10.10 GiB memory in use. Of the "
               "allocated memory 8.00 GiB is allocated by PyTorch, and 3.50 GiB is reserved by PyTorch but unallocated.")
    notes = memory_diagnosis(memory_facts(message))
    assert any("other processes hold about 12.5 GiB" in n for n in notes)
    assert any("expandable_segments" in n for n in notes)
    assert any("exceeds the free memory" in n for n in notes)


def test_memory_accounting_counts_parameters_gradients_and_optimizer_state_once():
    import torch
    import torch.nn as nn

    model = nn.Linear(256, 256)  # 65,792 float32 parameters = 263,168 bytes
    head = nn.Linear(256, 256)
    head.weight = model.weight  # tied weights: counted once
    opt = torch.optim.Adam(list(model.parameters()) + [head.bias], lr=1e-3)
    nn.functional.mse_loss(head(model(torch.randn(4, 256))), torch.randn(4, 256)).backward()
    opt.step()
    acc = memory_accounting([model, head], [opt], device_type="cpu")
    params = (256 * 256 + 256 + 256) * 4
    assert acc["parameters"] == params and acc["gradients"] == params
    # Adam: exp_avg and exp_avg_sq per parameter (+ a scalar step per parameter).
    assert 2 * params <= acc["optimizer_state"] <= 2 * params + 3 * 8
    assert acc["optimizers"] == ["Adam"]
    assert memory_accounting([model], [opt], device_type="cuda")["parameters"] == 0


def test_memory_breakdown_names_the_lever():
    gib = 2**30
    activations = memory_breakdown({"allocated": 70 * gib, "parameters": gib, "gradients": gib,
                                    "optimizer_state": 2 * gib, "optimizers": ["Adam"]})
    assert "the other 66.00 GiB are activations" in activations and "the batch" in activations
    model_bound = memory_breakdown({"allocated": 40 * gib, "parameters": 10 * gib, "gradients": 10 * gib,
                                    "optimizer_state": 18 * gib, "optimizers": ["AdamW"]})
    assert "AdamW state 18.00 GiB" in model_bound and "model's own state is the bulk" in model_bound
    assert memory_breakdown({"allocated": 0, "parameters": 1, "gradients": 0, "optimizer_state": 0}) is None


def test_devices_and_dtype_advice():
    assert devices_in_message("found at least two devices, cuda:0 and cpu!") == ["cuda:0", "cpu"]
    assert devices_in_message("Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor)") == ["cuda", "cpu"]
    assert "y.long()" in dtype_advice("Long", "Float", True)
    assert "x.float() / 255" in dtype_advice("float", "unsigned char", False)
    assert "x.float()" in dtype_advice("Float", "Double", False)


@pytest.mark.parametrize("source, use", [
    ("if x > 0:\n    pass", "`if`"),
    ("y = a and b", "`and`/`or`"),
    ("ok = 0 < x < 1", "chained comparison"),
    ("m = max(t)", "`max()`"),
    ("y = x + 1", None),
])
def test_truth_value_use(source, use):
    found = truth_value_use(ast.parse(source).body[0])
    assert (found is None) if use is None else (use in found)


def test_batch_indices_round_trip_through_the_note_text():
    note = batch_note([4, 5, 6, 7])
    assert indices_from_text(f"RuntimeError: stack expects ...\n{note}\n") == [4, 5, 6, 7]
    assert indices_from_text("no note") is None


@pytest.mark.parametrize("line, code", [
    ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!", "E101"),
    ("RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same", "E101"),
    ("RuntimeError: Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same or input should be a MKLDNN tensor", "E101"),
    ("RuntimeError: Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but got torch.cuda.FloatTensor instead (while checking arguments for embedding)", "E102"),
    ("RuntimeError: expected scalar type Long but found Float", "E102"),
    ("RuntimeError: Input type (double) and bias type (float) should be the same", "E102"),
    ("RuntimeError: result type Float can't be cast to the desired output type Long", "E123"),
    ("RuntimeError: Given groups=1, weight of size [64, 3, 7, 7], expected input[32, 224, 224, 3] to have 3 channels, but got 224 channels instead", "E104"),
    ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x2048 and 512x1000)", "E105"),
    ("AttributeError: 'DistributedDataParallel' object has no attribute 'backbone'", "E107"),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB", "E108"),
    ("RuntimeError: CUDA error: device-side assert triggered", "E109"),
    ("RuntimeError: Trying to backward through the graph a second time", "E110"),
    ("ValueError: Expected more than 1 value per channel when training, got input size torch.Size([1, 256])", "E113"),
    ("RuntimeError: DataLoader worker (pid 4120) is killed by signal: Killed.", "E115"),
    ("RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method", "E116"),
    ("IndexError: Target 1000 is out of bounds.", "E117"),
    ("ValueError: Expected input batch_size (64) to match target batch_size (32).", "E118"),
    ("RuntimeError: CUDA error: invalid device ordinal", "E120"),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input.", "E121"),
    ("AttributeError: Can't pickle local object 'get_transforms.<locals>.<lambda>'", "E122"),
    ("RuntimeError: 0D or 1D target tensor expected, multi-target not supported", "E124"),
    ("RuntimeError: Boolean value of Tensor with more than one value is ambiguous", "E125"),
    ("_pickle.UnpicklingError: Weights only load failed. WeightsUnpickler error: Unsupported global: GLOBAL argparse.Namespace was not an allowed global by default.", "E126"),
    ("RuntimeError: Sizes of tensors must match except in dimension 1. Expected size 32 but got size 31 for tensor number 1 in the list.", None),
    ("RuntimeError: stack expects each tensor to be equal size, but got [3] at entry 0 and [4] at entry 1", None),
    ("ValueError: Unknown optimizer 'sgdd'", None),
])
def test_message_to_code(line, code):
    from nndoctor.commands.explain.cli import explain_text

    findings, unexplained = explain_text(line)
    assert [f.code for f in findings] == ([code] if code else [])
    assert bool(unexplained) == (code is None)
