"""Explanations of shape crashes: E103 collate, E104 conv channels, E105 linear, E113 BN of one,
E117 target range, E118 batch sizes, E124 one-hot targets."""

from __future__ import annotations

import re
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation
from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.evidence import (
    context_inputs,
    crash_module,
    describe_tensor,
    functional_arguments,
    integer_range,
    live_objects,
    module_display_name,
    module_label,
    parse_described_shape,
    root_variable,
)
from nndoctor.commands.explain.instrument import NOTE_PREFIX
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register


def parse_shape(text: str) -> list[int]:
    return [int(p) for p in re.split(r"[,\s]+", text.strip()) if p]


def size_difference_kind(a: list[int], b: list[int]) -> str:
    """How two sample shapes differ: ``"color"`` (1/3/4 channels at the first or last dim),
    ``"size"`` (spatial sizes), ``"rank"`` (different number of dims)."""
    if len(a) != len(b):
        return "rank"
    differing = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(differing) == 1 and differing[0] in (0, len(a) - 1) and {a[differing[0]], b[differing[0]]} <= {1, 2, 3, 4}:
        return "color"
    return "size"


def _collate_involved(crash: Crash) -> bool:
    names = {f.function for f in crash.frames + crash.worker_frames}
    return (any("collate" in n for n in names) or "collate" in crash.message
            or NOTE_PREFIX in crash.message or crash.calls("fetch", "fetch.py"))


@register
class BatchCollateSizeMismatch(CrashExplanation):
    """
    ## What it does
    Explains "stack expects each tensor to be equal size" raised while the DataLoader builds a
    batch: re-fetches the failing batch's items one by one (indices recorded at the crash)
    and names the samples whose shape differs — their dataset index, shape and, for folder
    datasets (``ImageFolder``), their file path. From a log it still names the two shapes
    and, when the batch indices are in the message, the two samples.

    ## Why is this bad?
    One image of another size or another color
    mode breaks every
    batch it lands in, at a random step, and the traceback only shows torch's collate code.

    ## Example
    ```python
    transform = transforms.ToTensor()          # no resize: images keep their own sizes
    loader = DataLoader(ImageFolder("data", transform), batch_size=32, shuffle=True)
    ```

    ## Use instead
    ```python
    transform = transforms.Compose([transforms.Resize((32, 32)), transforms.ToTensor()])
    Image.open(path).convert("RGB")            # for grayscale/RGBA files
    ```

    ## References
    - PyTorch docs, ``torch.utils.data.default_collate``.
    """

    code = "E103"
    name = "batch-collate-size-mismatch"
    summary = "samples of different shapes could not be stacked into a batch"
    fix = "give every sample the same shape in the transform (Resize/CenterCrop, convert('RGB')), or pad in a collate_fn"
    patterns = (
        r"stack expects each tensor to be equal size, but got \[(?P<a>[\d, ]*)\] at entry (?P<ea>\d+) and \[(?P<b>[\d, ]*)\] at entry (?P<eb>\d+)",
        r"Sizes of tensors must match except in dimension 0\. (?:Got (?P<ga>\d+) and (?P<gb>\d+) in dimension (?P<gd>\d+)|Expected size (?P<ga2>\d+) but got size (?P<gb2>\d+))",
    )
    order = 30

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        facts = super().match(crash)
        return facts if facts is not None and _collate_involved(crash) else None

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        from nndoctor.commands.explain.samples import (
            batch_indices,
            describe_probe,
            find_dataset,
            odd_items,
            probe_items,
        )

        evidence: dict[str, Any] = {}
        indices = batch_indices(crash)
        shapes = ((parse_shape(facts["a"]), parse_shape(facts["b"])) if "a" in facts else None)
        if indices is not None:
            evidence["batch_indices"] = indices[:32]
        odd_text = ""
        kind = size_difference_kind(*shapes) if shapes else "size"
        if shapes:
            ea, eb = int(facts["ea"]), int(facts["eb"])
            name_a = f"index {indices[ea]}" if indices and ea < len(indices) else f"entry {ea}"
            name_b = f"index {indices[eb]}" if indices and eb < len(indices) else f"entry {eb}"
            evidence["shapes"] = {name_a: shapes[0], name_b: shapes[1]}
            odd_text = f" Sample {name_b} is {shapes[1]} while sample {name_a} is {shapes[0]}."
            odd_text = odd_text.replace("Sample entry", "The batch's entry").replace("sample entry", "entry")
        dataset = find_dataset(crash) if crash.is_live else None
        if dataset is not None and indices:
            probes = probe_items(dataset, indices)
            majority, odd = odd_items(probes)
            if odd and majority is not None:
                evidence.pop("shapes", None)
                evidence["majority_shape"] = majority
                evidence["odd_samples"] = [describe_probe(p) for p in odd[:10]]
                paths = [p.path for p in odd if p.path]
                if paths:
                    evidence["files"] = paths[:10]
                listed = "; ".join(describe_probe(p) for p in odd[:5])
                more = f" (+{len(odd) - 5} more)" if len(odd) > 5 else ""
                odd_text = (f" Re-fetched one by one, most of the batch's {len(probes)} samples are "
                            f"{majority}, but {listed}{more}.")
                if len(odd) == 1 and odd[0].shapes and majority:
                    other = parse_described_shape(odd[0].shapes[0]) or []
                    kind = size_difference_kind(parse_described_shape(majority) or [], other)
        elif "ga" in facts or "ga2" in facts:
            evidence["sizes"] = [facts.get("ga") or facts.get("ga2"), facts.get("gb") or facts.get("gb2")]
        cause = ("a different number of color channels (a grayscale or RGBA image among RGB ones)"
                 if kind == "color" else "different sizes")
        message = f"The DataLoader could not stack a batch's samples into one tensor: they have {cause}.{odd_text}"
        fix = ("convert every image to RGB when loading: `Image.open(path).convert(\"RGB\")`"
               if kind == "color" else cls.fix)
        return cls.make(crash, message, fix=fix, evidence=evidence)


def channel_layout(input_shape: list[int], expected: int, got: int) -> str:
    """Why a conv got the wrong number of channels, from the input's shape (pure).

    ``channels_last``: N,H,W,C (or H,W,C) data; ``grayscale``: 1 channel for a 3-channel
    layer; ``rgba``: 4 for 3; ``rgb_for_gray``: 3 for a 1-channel layer; ``layers``: the
    previous layer's output channels differ from this layer's ``in_channels``.
    """
    if input_shape and input_shape[-1] == expected and len(input_shape) >= 3 and got != expected:
        if len(input_shape) == 4 and input_shape[1] != expected or len(input_shape) == 3:
            return "channels_last"
    if expected == 3 and got == 1:
        return "grayscale"
    if expected == 3 and got == 4:
        return "rgba"
    if expected == 1 and got == 3:
        return "rgb_for_gray"
    return "layers"


_LAYOUT_FIX = {
    "channels_last": ("the batch is laid out N,H,W,C (channels last) but PyTorch convolutions take N,C,H,W",
                      "permute the batch: `x = x.permute(0, 3, 1, 2)` (or use transforms.ToTensor(), which converts H,W,C images to C,H,W)"),
    "grayscale": ("the images are grayscale (1 channel) and the layer expects 3 (RGB)",
                  "convert when loading: `Image.open(p).convert(\"RGB\")` (or transforms.Grayscale(num_output_channels=3)); or build the first conv with in_channels=1"),
    "rgba": ("the images are RGBA (4 channels: PNG with transparency) and the layer expects 3 (RGB)",
             "convert when loading: `Image.open(p).convert(\"RGB\")`"),
    "rgb_for_gray": ("the images are RGB (3 channels) and the layer expects 1 (grayscale)",
                     "convert with transforms.Grayscale() or build the first conv with in_channels=3"),
    "layers": ("this layer's in_channels does not match the channels produced by the layer before it",
               "make this layer's in_channels equal to the previous layer's out_channels"),
}


@register
class ConvChannelMismatch(CrashExplanation):
    """
    ## What it does
    Explains "expected input[N, …] to have 3 channels, but got 224 channels instead": decides
    from the input's shape whether the batch is N,H,W,C (channels last), grayscale (1
    channel), RGBA (4 channels), or whether two layers of the model disagree, names the
    convolution (``model.conv1``) and gives the fix (permute, ``convert("RGB")``, ToTensor).

    ## Why is this bad?
    Images loaded with PIL/OpenCV/numpy are H,W,C; PyTorch convolutions want C,H,W. Folders of "RGB" photos often hide grayscale or RGBA files. The
    error names the channel count but not which of these happened.

    ## Example
    ```python
    x = torch.from_numpy(images)      # [N, 224, 224, 3]
    model(x)                          # expected input[N, 224, 224, 3] to have 3 channels, but got 224
    ```

    ## Use instead
    ```python
    x = torch.from_numpy(images).permute(0, 3, 1, 2)   # or transforms.ToTensor()
    Image.open(path).convert("RGB")
    ```

    ## References
    - PyTorch docs, `Conv2d` (input is N, C_in, H, W): https://pytorch.org/docs/stable/generated/torch.nn.Conv2d.html
    - torchvision `ToTensor` (H, W, C → C, H, W): https://pytorch.org/vision/stable/generated/torchvision.transforms.ToTensor.html
    """

    code = "E104"
    name = "conv-channel-mismatch"
    summary = "a convolution received the wrong number of channels (N,H,W,C, grayscale or RGBA input)"
    fix = "feed N,C,H,W RGB batches: permute(0, 3, 1, 2) / transforms.ToTensor(), Image.convert('RGB')"
    patterns = (
        r"weight of size \[(?P<weight>[\d, ]+)\], expected input\[(?P<input>[\d, ]+)\] to have (?P<expected>\d+) channels, but got (?P<got>\d+) channels instead",
    )
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        shape = parse_shape(facts["input"])
        expected, got = int(facts["expected"]), int(facts["got"])
        layout = channel_layout(shape, expected, got)
        if layout == "layers" and crash.is_live and _is_first_conv(crash):
            layout = "layers_first"
        cause, fix = _LAYOUT_FIX.get(layout, _LAYOUT_FIX["layers"])
        if layout == "layers_first":
            cause = f"the model's first convolution expects {expected} channels but the data has {got}"
            fix = f"give the data {expected} channels, or build the first conv with in_channels={got}"
        evidence: dict[str, Any] = {"input_shape": shape, "weight_shape": parse_shape(facts["weight"]),
                                    "expected_channels": expected, "got_channels": got, "layout": layout}
        subject = module_label(crash) or "A convolution"
        message = (f"{subject} expects {expected} input channels but received a batch of shape "
                   f"{shape} ({got} at dim 1): {cause}.")
        return cls.make(crash, message, fix=fix, evidence=evidence)


def _is_first_conv(crash: Crash) -> bool:
    inner = crash_module(crash)
    found = root_variable(crash)
    if inner is None or found is None:
        return False
    import torch.nn as nn

    first = next((m for m in found[1].modules() if isinstance(m, nn.modules.conv._ConvNd)), None)
    return first is inner


def linear_mismatch(rows: int, got: int, expected: int, input_shape: list[int] | None) -> tuple[str, str]:
    """(cause, fix) for "mat1 and mat2 shapes cannot be multiplied" (pure)."""
    if input_shape and len(input_shape) > 2:
        flat = 1
        for s in input_shape[1:]:
            flat *= s
        return (f"the input reaches the Linear layer as {input_shape}: it multiplies only the last "
                f"dimension ({input_shape[-1]}), the {len(input_shape)}-D feature map was never flattened "
                f"(flattened it has {flat} features)",
                f"flatten before the Linear layer: `x = torch.flatten(x, 1)` and use in_features={flat}")
    ratio = got / expected if expected else 0
    root = round(ratio ** 0.5) if ratio > 1 else 0
    if ratio > 1 and root * root == ratio:
        return (f"each sample has {got} features but the layer was built for {expected}: {got} = "
                f"{expected} × {root}×{root}, as if the feature map is {root}×{root} instead of 1×1 "
                f"(input images larger than the model was designed for?)",
                f"use in_features={got}, or nn.AdaptiveAvgPool2d(1) before flattening so any image size works")
    return (f"each sample has {got} features but the layer was built with in_features={expected}",
            f"build the layer with in_features={got} (or nn.LazyLinear), or fix the layer before it")


@register
class LinearShapeMismatch(CrashExplanation):
    """
    ## What it does
    Explains "mat1 and mat2 shapes cannot be multiplied (4x2048 and 512x10)": names the Linear
    layer (``model.fc``), says how many features arrive and how many it was built for, and
    recognises an unflattened feature map or a feature map larger than designed.

    ## Why is this bad?
    ``in_features`` is usually computed by hand from the image size; a different input size,
    an extra pooling layer or a missing ``flatten`` breaks it, and the message's "mat1/mat2"
    names neither the layer nor the cause.

    ## Example
    ```python
    self.fc = nn.Linear(512, 10)
    x = self.features(x)            # [N, 512, 2, 2] for 64×64 inputs
    return self.fc(x.flatten(1))    # 2048 features
    ```

    ## Use instead
    ```python
    self.pool = nn.AdaptiveAvgPool2d(1)    # any input size -> [N, 512, 1, 1]
    ```

    ## References
    - PyTorch docs, ``nn.Linear``, ``nn.LazyLinear``, ``nn.AdaptiveAvgPool2d``.
    """

    code = "E105"
    name = "linear-shape-mismatch"
    summary = "a Linear layer received a different number of features than it was built for"
    fix = "match in_features to the flattened input (torch.flatten(x, 1)), or use AdaptiveAvgPool2d / LazyLinear"
    patterns = (r"mat1 and mat2 shapes cannot be multiplied \((?P<r1>\d+)x(?P<c1>\d+) and (?P<r2>\d+)x(?P<c2>\d+)\)",
                r"size mismatch, m1: \[(?P<r1b>\d+) x (?P<c1b>\d+)\], m2: \[(?P<r2b>\d+) x (?P<c2b>\d+)\]")
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        rows = int(facts.get("r1") or facts["r1b"])
        got = int(facts.get("c1") or facts["c1b"])
        expected = int(facts.get("r2") or facts["r2b"])
        out = int(facts.get("c2") or facts["c2b"])
        inputs = context_inputs(crash)
        input_shape = parse_described_shape(inputs[0]) if inputs else None
        cause, fix = linear_mismatch(rows, got, expected, input_shape)
        evidence: dict[str, Any] = {"in_features": expected, "out_features": out, "features_received": got}
        if inputs:
            evidence["inputs"] = inputs
        name = module_display_name(crash)
        subject = f"{name} (Linear {expected}→{out})" if name else f"A Linear layer ({expected}→{out})"
        message = f"{subject} cannot take its input: {cause}."
        return cls.make(crash, message, fix=fix, evidence=evidence)


def _loaders(crash: Crash) -> list[Any]:
    loaders: list[Any] = []
    state = crash.session.state if crash.session is not None else None
    if state is not None:
        loaders.extend(list(state.loader_lengths.keys()))
    if crash.is_live:
        try:
            from torch.utils.data import DataLoader

            for _, value in live_objects(crash, lambda v: isinstance(v, DataLoader)):
                if all(value is not known for known in loaders):
                    loaders.append(value)
        except ImportError:  # pragma: no cover
            pass
    return loaders


def last_batch_size(dataset_size: int, batch_size: int, drop_last: bool) -> int | None:
    """Size of the final batch of an epoch (None when drop_last discards it)."""
    remainder = dataset_size % batch_size
    if remainder == 0:
        return batch_size
    return None if drop_last else remainder


@register
class BatchnormSingleSample(CrashExplanation):
    """
    ## What it does
    Explains "Expected more than 1 value per channel when training": names the BatchNorm
    layer, and checks the run's DataLoaders for a last batch of exactly one sample
    (``len(dataset) % batch_size == 1`` without ``drop_last``).

    ## Why is this bad?
    BatchNorm in training mode normalises with the batch's own statistics; one value per
    channel has no variance. It typically crashes at the very end of the first epoch — after
    the whole epoch has run — when the dataset size leaves one sample over.

    ## Example
    ```python
    loader = DataLoader(train_set, batch_size=32)   # len(train_set) == 1025
    ```

    ## Use instead
    ```python
    loader = DataLoader(train_set, batch_size=32, drop_last=True)
    ```
    For batch size 1 by design, use GroupNorm/LayerNorm or keep BN in eval mode.

    ## References
    - PyTorch docs, ``nn.BatchNorm1d`` and ``DataLoader(drop_last=...)``.
    """

    code = "E113"
    name = "batchnorm-single-sample"
    summary = "BatchNorm in training mode got a batch with one value per channel"
    fix = "DataLoader(..., drop_last=True) for training; for batch size 1 use GroupNorm/LayerNorm"
    patterns = (r"Expected more than 1 value per channel when training, got input size (?:torch\.Size\()?\[(?P<shape>[\d, ]+)\]",)
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        shape = parse_shape(facts["shape"])
        evidence: dict[str, Any] = {"input_shape": shape}
        subject = module_label(crash) or "A BatchNorm layer"
        message = f"{subject} is in training mode and got a batch of shape {shape}: one value per channel has no variance."
        fix = cls.fix
        for loader in _loaders(crash):
            try:
                size, batch = len(loader.dataset), loader.batch_size
            except Exception:  # noqa: BLE001 - iterable datasets have no length
                continue
            if not batch:
                continue
            last = last_batch_size(size, batch, bool(loader.drop_last))
            if last == 1:
                evidence["dataset_size"] = size
                evidence["batch_size"] = batch
                message += (f" The DataLoader has {size} samples with batch_size={batch}, so the last batch "
                            f"of every epoch holds 1 sample ({size} = {size // batch}×{batch} + 1).")
                fix = "pass drop_last=True to the training DataLoader"
                break
            if batch == 1:
                evidence["batch_size"] = 1
                message += " The DataLoader uses batch_size=1."
                fix = "use a batch size above 1, or GroupNorm/LayerNorm instead of BatchNorm"
                break
        return cls.make(crash, message, fix=fix, evidence=evidence)


def _loss_tensors(crash: Crash) -> tuple[Any, Any, str] | None:
    found = functional_arguments(crash, ("cross_entropy", "nll_loss", "binary_cross_entropy_with_logits",
                                         "binary_cross_entropy", "multi_margin_loss"))
    if found is None:
        return None
    return found.get("input"), found.get("target"), found["__function__"]


def target_range_cause(low: int, high: int, classes: int, ignore_index: int | None = -100) -> tuple[str, str]:
    """(cause, fix) for targets outside [0, classes) (pure). The cause completes "the model
    outputs C classes (valid targets 0..C-1) but …": it does not repeat that clause."""
    if low >= 1 and high == classes:
        return (f"the labels run from {low} to {high}: they are 1-based, but class indices must be 0..{classes - 1}",
                "subtract 1 from the labels (`y = y - 1`) where the dataset builds them")
    if low < 0 and low != ignore_index:
        return (f"the labels contain {low}; negative labels are only allowed as ignore_index "
                f"(currently {ignore_index})",
                f"pass ignore_index={low} to the loss if {low} marks padding, else fix the labels")
    return (f"the labels go up to {high}",
            f"give the output layer {high + 1} classes (out_features={high + 1}), or remap the labels to 0..{classes - 1}")


@register
class TargetOutOfBounds(CrashExplanation):
    """
    ## What it does
    Explains "IndexError: Target 10 is out of bounds": reads the loss's input and target at
    the crash, and says whether the labels are 1-based (1..C for C outputs), negative padding
    values without ``ignore_index``, or more classes than the model outputs.

    ## Why is this bad?
    ``CrossEntropyLoss`` wants class indices in ``[0, C)``. Datasets numbered from 1 or a
    classifier built with one class too few crash here on CPU — and on GPU turn into an
    unhelpful device-side assert (E109).

    ## Example
    ```python
    y = torch.tensor(df["label"])      # 1..10
    F.cross_entropy(logits, y)         # logits: [N, 10]
    ```

    ## Use instead
    ```python
    F.cross_entropy(logits, y - 1)
    ```

    ## References
    - PyTorch docs, ``CrossEntropyLoss`` (targets in [0, C), ``ignore_index``).
    """

    code = "E117"
    name = "target-out-of-bounds"
    summary = "a class target outside [0, C) reached the loss"
    fix = "class targets must be 0..C-1: shift 1-based labels (y - 1) or give the model more outputs"
    # The second is PyTorch <= 1.0's CPU wording of the same check (THNN ClassNLLCriterion).
    patterns = (r"Target (?P<target>-?\d+) is out of bounds",
                r"Assertion `cur_target >= 0 && cur_target < n_classes' failed")
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        target_value = int(facts["target"]) if "target" in facts else None
        evidence: dict[str, Any] = {"target": target_value} if target_value is not None else {}
        named = f"class target {target_value}" if target_value is not None else "a class target"
        message = f"The loss received {named}, outside the range of the model's outputs."
        fix = cls.fix
        found = _loss_tensors(crash)
        if found is not None:
            logits, target, function = found
            classes = int(logits.shape[1]) if getattr(logits, "dim", lambda: 0)() >= 2 else None
            span = integer_range(target)
            ignore = None
            args = functional_arguments(crash, (function,)) or {}
            ignore = args.get("ignore_index", -100)
            evidence.update({"loss": function, "input": describe_tensor(logits), "target_tensor": describe_tensor(target)})
            if classes is not None and span is not None:
                evidence["classes"] = classes
                evidence["target_range"] = list(span)
                cause, fix = target_range_cause(span[0], span[1], classes, ignore)
                message = f"{function}: the model outputs {classes} classes (valid targets 0..{classes - 1}) but {cause}."
        return cls.make(crash, message, fix=fix, evidence=evidence)


def batch_size_cause(n_input: int, n_target: int, input_shape: list[int] | None,
                     target_shape: list[int] | None) -> tuple[str, str]:
    """(cause, fix) for "Expected input batch_size (A) to match target batch_size (B)" (pure)."""
    if target_shape and len(target_shape) >= 2 and n_input == target_shape[0] * target_shape[1]:
        return (f"the output was flattened to {n_input} rows (batch × sequence) but the target {target_shape} was not",
                "flatten the target the same way: `loss_fn(out.view(-1, C), y.view(-1)`")
    if n_target and n_input % n_target == 0 and n_input > n_target:
        k = n_input // n_target
        return (f"the output has {k}× as many rows as the target: a `view(-1, F)`/`reshape` in forward "
                f"uses a feature size {k}× too small and folds part of each sample into the batch dimension",
                "flatten with `x.flatten(1)` / `x.view(x.size(0), -1)` so the batch dimension is kept")
    return (f"the output has {n_input} rows and the target {n_target}: they come from different batches "
            "or the model changes the batch dimension",
            "make sure output and target come from the same batch and forward keeps dim 0 as the batch")


@register
class BatchSizeMismatch(CrashExplanation):
    """
    ## What it does
    Explains "Expected input batch_size (64) to match target batch_size (32)": reads the loss's
    input and target shapes and recognises a ``view(-1, F)`` with the wrong F inside
    ``forward`` or a sequence output flattened without its target.

    ## Why is this bad?
    ``x.view(-1, 512)`` with the wrong 512 silently moves part of each sample into the batch
    dimension; the model "works" until the loss compares it with the targets.

    ## Example
    ```python
    x = x.view(-1, 16 * 5 * 5)      # the feature map is really 16×10×10
    ```

    ## Use instead
    ```python
    x = torch.flatten(x, 1)         # keeps dim 0 as the batch
    ```

    ## References
    - PyTorch docs, ``torch.flatten``; ``CrossEntropyLoss`` shape rules.
    """

    code = "E118"
    name = "batch-size-mismatch"
    summary = "the loss got outputs and targets with different batch sizes"
    fix = "keep the batch dimension in forward (torch.flatten(x, 1)); flatten output and target alike"
    patterns = (r"Expected input batch_size \((?P<n_input>\d+)\) to match target batch_size \((?P<n_target>\d+)\)",)
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        n_input, n_target = int(facts["n_input"]), int(facts["n_target"])
        evidence: dict[str, Any] = {"input_batch": n_input, "target_batch": n_target}
        input_shape = target_shape = None
        found = _loss_tensors(crash)
        if found is not None:
            logits, target, _ = found
            input_shape = list(getattr(logits, "shape", []) or []) or None
            target_shape = list(getattr(target, "shape", []) or []) or None
            evidence["input"] = describe_tensor(logits)
            evidence["target"] = describe_tensor(target)
        cause, fix = batch_size_cause(n_input, n_target, input_shape, target_shape)
        message = f"The loss got {n_input} predictions for {n_target} targets: {cause}."
        return cls.make(crash, message, fix=fix, evidence=evidence)


@register
class MultiTarget(CrashExplanation):
    """
    ## What it does
    Explains "0D or 1D target tensor expected, multi-target not supported" and "Expected
    floating point type for target with class probabilities, got Long": the targets are
    one-hot (or ``[N, 1]``) where class indices ``[N]`` are expected.

    ## Why is this bad?
    ``CrossEntropyLoss`` takes class indices; no one-hot encoding is needed. Keras-style one-hot labels crash here, or — as float
    probabilities — silently change the loss's meaning.

    ## Example
    ```python
    y = F.one_hot(labels, 10)           # [N, 10] int64
    F.cross_entropy(logits, y)
    ```

    ## Use instead
    ```python
    F.cross_entropy(logits, labels)     # [N] int64
    F.cross_entropy(logits, y.argmax(dim=1))
    ```

    ## References
    - PyTorch docs, ``CrossEntropyLoss`` (class indices or float probabilities).
    """

    code = "E124"
    name = "multi-target"
    summary = "one-hot or [N, 1] targets where class indices [N] are expected"
    fix = "pass class indices: y.argmax(dim=1) for one-hot targets, y.squeeze(1) for [N, 1]"
    patterns = (r"0D or 1D target tensor expected, multi-target not supported",
                r"Expected floating point type for target with class probabilities, got (?P<dtype>\w+)")
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = {}
        message = "The loss expects one class index per sample ([N]) but received a multi-column target."
        fix = cls.fix
        found = _loss_tensors(crash)
        if found is not None:
            logits, target, _ = found
            shape = list(getattr(target, "shape", []))
            classes = int(logits.shape[1]) if getattr(logits, "dim", lambda: 0)() >= 2 else None
            evidence.update({"input": describe_tensor(logits), "target": describe_tensor(target)})
            if len(shape) == 2 and shape[1] == 1:
                message = f"The target has shape {shape}: one index per sample, but with an extra dimension."
                fix = "squeeze it: `y = y.squeeze(1)` (or `y.view(-1)`)"
            elif len(shape) == 2 and classes is not None and shape[1] == classes:
                message = (f"The target has shape {shape}: one-hot labels for {classes} classes, "
                           "where CrossEntropyLoss takes class indices of shape [N].")
                fix = "pass `y.argmax(dim=1)` (or keep the integer labels instead of one-hot encoding them)"
        elif facts.get("dtype"):
            message = (f"The target has the same shape as the output but dtype {facts['dtype']}: "
                       "one-hot labels, where CrossEntropyLoss takes class indices of shape [N].")
            fix = "pass `y.argmax(dim=1)`; for soft labels use float probabilities (`y.float()`)"
        return cls.make(crash, message, fix=fix, evidence=evidence)

