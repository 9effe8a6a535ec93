"""Older PyTorch wordings of errors the catalog explains, and their current wording.

PyTorch reworded many errors over the years (the TH/THC backends were removed in 1.x, device
and dtype checks were unified in 1.5–1.8). Logs in old issues and from old installs still
carry the old text, so a pasted log is read against the current wording as well:
``current_wording`` returns the equivalent message of today's PyTorch, which the crash keeps
beside the original (the user still sees what their log said).

Sources for the old wordings: PyTorch 0.4–1.7 error texts as quoted in public issues, e.g.
pytorch/pytorch#5135 (size mismatch, m1/m2), #43259 and the issues cited in
tests/explain/pasted/.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_Rewrite = Callable[[re.Match[str]], str]


def _dtype(name: str) -> str:
    """'FLoat' / 'LongTensor' / 'long' -> 'Float' / 'Long' (pasted text is often retyped)."""
    name = re.sub(r"Tensor$", "", name.strip(), flags=re.I)
    return name[:1].upper() + name[1:].lower()


def _legacy_tensor_type(m: re.Match[str]) -> str:
    expected_cuda, found_cuda = bool(m.group("ecuda")), bool(m.group("fcuda"))
    if expected_cuda != found_cuda:
        devices = ("cuda", "cpu") if expected_cuda else ("cpu", "cuda")
        return f"Expected all tensors to be on the same device, but found at least two devices, {devices[0]} and {devices[1]}!"
    return f"expected scalar type {_dtype(m.group('expected'))} but found {_dtype(m.group('found'))}"


def _device_name(name: str) -> str:
    return "cuda" if name.lower() in ("cuda", "gpu") else name.lower()


_OLD_WORDINGS: tuple[tuple[re.Pattern[str], _Rewrite], ...] = (
    # PyTorch 1.0–1.5: "Expected object of scalar type Long but got scalar type Float for argument #2 'target'"
    (re.compile(r"Expected object of scalar type (?P<expected>\w+) but got scalar type (?P<found>\w+)", re.I),
     lambda m: f"expected scalar type {_dtype(m.group('expected'))} but found {_dtype(m.group('found'))}"),
    # PyTorch 0.4: "Expected object of type torch.cuda.FloatTensor but found type torch.FloatTensor for argument #2"
    (re.compile(r"Expected object of type torch\.(?P<ecuda>cuda\.)?(?P<expected>\w+?)Tensor "
                r"but found type torch\.(?P<fcuda>cuda\.)?(?P<found>\w+?)Tensor"), _legacy_tensor_type),
    # PyTorch 1.0: "Expected object of backend CUDA but got backend CPU for argument #2 'mat2'"
    (re.compile(r"Expected object of backend (?P<a>\w+) but got backend (?P<b>\w+)"),
     lambda m: ("Expected all tensors to be on the same device, but found at least two devices, "
                f"{_device_name(m.group('a'))} and {_device_name(m.group('b'))}!")),
    # PyTorch 1.6–1.8: "Tensor for argument #2 'mat1' is on CPU, but expected it to be on GPU"
    (re.compile(r"Tensor for argument #\d+ '\w+' is on (?P<a>CPU|GPU)\b.*?expected (?:it|them) to be on (?P<b>CPU|GPU)"),
     lambda m: ("Expected all tensors to be on the same device, but found at least two devices, "
                f"{_device_name(m.group('a'))} and {_device_name(m.group('b'))}!")),
    # PyTorch ≤ 1.4 TH backend: "size mismatch, m1: [64 x 784], m2: [512 x 10]"
    (re.compile(r"size mismatch, m1: \[(?P<r1>\d+) x (?P<c1>\d+)\], m2: \[(?P<r2>\d+) x (?P<c2>\d+)\]"),
     lambda m: f"mat1 and mat2 shapes cannot be multiplied ({m['r1']}x{m['c1']} and {m['r2']}x{m['c2']})"),
    # PyTorch ≤ 1.4: "cuda runtime error (2) : out of memory at .../THCStorage.cu:58"
    (re.compile(r"cuda runtime error \(2\) : out of memory|THCudaCheck FAIL .*error=2 : out of memory"),
     lambda m: "CUDA out of memory."),
    # PyTorch ≤ 1.0: "multi-target not supported at .../ClassNLLCriterion.c:22"
    (re.compile(r"(?<!expected, )multi-target not supported"),
     lambda m: "0D or 1D target tensor expected, multi-target not supported"),
    # PyTorch ≤ 1.8: "bool value of Tensor with more than one value is ambiguous"
    (re.compile(r"\bbool value of Tensor with more than one value is ambiguous"),
     lambda m: "Boolean value of Tensor with more than one value is ambiguous"),
    # PyTorch 0.4–1.0: "Given groups=1, weight[64, 3, 7, 7], so expected input[1, 1, 224, 224] to have 3 channels"
    (re.compile(r"weight\[(?P<weight>[\d, ]+)\], so expected input\[(?P<input>[\d, ]+)\] to have (?P<e>\d+) "
                r"channels, but got (?P<g>\d+) channels instead"),
     lambda m: (f"weight of size [{m['weight']}], expected input[{m['input']}] to have {m['e']} channels, "
                f"but got {m['g']} channels instead")),
    # Same error for any output index: "element 1 of tensors does not require grad and does not have a grad_fn"
    (re.compile(r"element [1-9]\d* of tensors does not require grad and does not have a grad_fn"),
     lambda m: "element 0 of tensors does not require grad and does not have a grad_fn"),
)

# Messages of errors the catalog explains that users paste without the exception's name
# ("Expected object of device type cuda but got device type cpu ..." above a cut traceback).
KNOWN_MESSAGE_START = re.compile(
    r"^\s*(?:Expected object of (?:scalar type|device type|backend|type)|Expected all tensors to be on the same device"
    r"|CUDA out of memory|CUDA error: (?:out of memory|device-side assert)|cuda runtime error \(\d+\)"
    r"|stack expects each tensor to be equal size|mat1 and mat2 shapes cannot be multiplied|size mismatch, m1:"
    r"|Error\(s\) in loading state_dict|Given groups=\d+, weight|element \d+ of tensors does not require grad"
    r"|Target -?\d+ is out of bounds|Expected input batch_size|Trying to backward through the graph a second time"
    r"|one of the variables needed for gradient computation has been modified by an inplace operation)"
)

# TensorFlow's messages as its C++ logging prints them, without a Python exception's name
# ("W tensorflow/core/framework/op_kernel.cc:975] Invalid argument: Received a label value …",
# "… dso_loader.cc:64] Could not load dynamic library 'libcudart.so.11.0'"): found anywhere in a line.
KNOWN_TF_MESSAGE = re.compile(
    r"Received a label value of -?\d+ which is outside the valid range|OOM when allocating tensor"
    r"|No gradients provided for any variable|is incompatible with (?:the )?layer"
    r"|Can't parse serialized Example|Could not load dynamic library '|DNN library is not found"
    r"|Matrix size-incompatible:"
)


def current_wording(text: str) -> list[str]:
    """Today's wording of every old-style error message found in ``text`` (empty when none)."""
    found = []
    for pattern, rewrite in _OLD_WORDINGS:
        match = pattern.search(text)
        if match:
            found.append(rewrite(match))
    return found
