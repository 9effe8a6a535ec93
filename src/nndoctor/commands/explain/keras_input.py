"""E134: Keras's "Input 0 of layer … is incompatible with the layer", said in words.

Keras checks every layer's input against the layer's ``InputSpec`` and reports the two shapes
(or ranks, or the one axis that differs). ``mismatch`` reads what the difference means — a
missing batch or channel axis, channels-first data for a channels-last model, RGBA or
grayscale images, images of another size, features that are not flattened or not the count
the model was built for — from the shapes alone, so ``nndoctor explain`` says the same as a
live run; the live run adds the layer's class from the layer object itself.
"""

from __future__ import annotations

import re
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation
from nndoctor.commands.explain.crash import Crash
from nndoctor.commands.explain.tf_text import parse_shape, plain, show_shape
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register

_SHAPE = r"\((?:[\w?]+,? ?)*\)|\[(?:[\w?]+,? ?)*\]"
_LAYER = r"(?:Input (?P<index>\d+)(?: with name '[^']*')? of layer [\"']?(?P<layer>[\w./-]+)[\"']? is incompatible with the layer" \
         r"|Input (?P<index2>\d+) is incompatible with layer [\"']?(?P<layer2>[\w./-]+)[\"']?)"

Shape = list[Any]


def _dims(shape: Shape) -> str:
    return "×".join("?" if s is None else str(s) for s in shape)


def _channels_moved(expected: Shape, found: Shape) -> str | None:
    """"first" when ``found`` is ``expected`` (N,H,W,C) with its channel axis moved to dim 1,
    "last" for the reverse (a channels_first model given N,H,W,C data)."""
    if len(expected) != len(found) or len(found) < 3:
        return None

    def same(a: Shape, b: Shape) -> bool:
        return all(x is None or y is None or x == y for x, y in zip(a, b))

    if (expected[-1] is not None and found[1] == expected[-1] and found[-1] != expected[-1]
            and same(found[2:], expected[1:-1])):
        return "first"
    if (expected[1] is not None and found[-1] == expected[1] and found[1] != expected[1]
            and same(found[1:-1], expected[2:])):
        return "last"
    return None


def _color(expected_channels: int | None, found_channels: int | None) -> tuple[str, str] | None:
    pair = (expected_channels, found_channels)
    if pair == (3, 4):
        return ("the images are RGBA (4 channels, e.g. PNG with transparency) and the model takes RGB (3)",
                "drop the alpha channel: `image.convert(\"RGB\")` when loading, or `x = x[..., :3]`")
    if pair == (3, 1):
        return ("the images are grayscale (1 channel) and the model takes RGB (3)",
                "convert to RGB (`image.convert(\"RGB\")`, `tf.image.grayscale_to_rgb`), or build the model with 1 input channel")
    if pair == (1, 3):
        return ("the images are RGB (3 channels) and the model takes grayscale (1)",
                "convert with `tf.image.rgb_to_grayscale`, or build the model with 3 input channels")
    return None


def rank_mismatch(expected_rank: int, found: Shape | None, found_rank: int) -> tuple[str, str]:
    """(cause, fix) when the input has another number of axes than the layer takes (pure)."""
    shown = show_shape(found) if found else f"{found_rank} axes"
    if found_rank == expected_rank - 1:
        if found and expected_rank == 4 and found[-1] in (1, 3, 4) and found[0] is not None and found[0] > 4:
            return (f"the input {shown} is one image (height, width, channels) without the batch axis",
                    "add the batch axis: `x = np.expand_dims(x, 0)` (or `x[None]`); to predict one sample, "
                    "`model.predict(x[None])`")
        if found and found[-1] is not None and found[-1] > 4 and expected_rank == 4:
            return (f"the input {shown} has no channel axis: grayscale images given as (batch, height, width), "
                    "while the convolution takes (batch, height, width, channels)",
                    "add the channel axis: `x = np.expand_dims(x, -1)` (or `x[..., None]`), and use "
                    "`keras.Input(shape=(height, width, 1))`")
        if expected_rank == 3:
            return (f"the input {shown} has no features axis: sequence layers (LSTM, GRU, Conv1D) take "
                    "(batch, timesteps, features)",
                    "add a features axis: `x = np.expand_dims(x, -1)` (one feature per time step), or reshape "
                    "to (batch, timesteps, features)")
        return (f"the input {shown} has one axis fewer than the layer takes ({expected_rank})",
                "add the missing axis (`np.expand_dims`): the batch axis for a single sample, else the feature/channel axis")
    if found_rank == expected_rank + 1:
        if found and found[0] == 1:
            return (f"the input {shown} has an extra leading axis of size 1 (a batch of one added twice)",
                    "remove the extra axis: `x = np.squeeze(x, 0)` or do not wrap the batch in another list")
        return (f"the input {shown} has one axis more than the layer takes ({expected_rank})",
                "flatten or squeeze the extra axis (`keras.layers.Flatten()`, `np.squeeze`), or pick a layer for that rank")
    return (f"the input {shown} has {found_rank} axes where the layer takes {expected_rank}",
            f"reshape the data to {expected_rank} axes (batch first), as the model's Input declares")


def axis_mismatch(axis: int, expected_value: int, found: Shape, layer: str) -> tuple[str, str]:
    """(cause, fix) when one axis of the input has another size than the layer was built for (pure)."""
    got = found[axis] if -len(found) <= axis < len(found) else None
    if axis == -1 and len(found) >= 3:
        moved = _channels_moved([None] * (len(found) - 1) + [expected_value], found)
        if moved == "first" or (found[1] == expected_value and got != expected_value and len(found) == 4):
            return (f"the input {show_shape(found)} is channels-first (batch, channels, height, width) and "
                    f"'{layer}' takes channels-last data with {expected_value} channel{'s' if expected_value != 1 else ''} "
                    "on the last axis",
                    "transpose the batch to (batch, height, width, channels): `x = np.transpose(x, (0, 2, 3, 1))` "
                    "(or `tf.transpose`), or build the model with data_format=\"channels_first\"")
        color = _color(expected_value, got)
        if color:
            return color
        rest = [s for s in found[1:]]
        if all(isinstance(s, int) for s in rest):
            product = 1
            for s in rest:
                product *= s
            if product == expected_value:
                return (f"the input {show_shape(found)} is not flattened: {'×'.join(map(str, rest))} = {expected_value} "
                        f"values per sample, which '{layer}' takes as one vector",
                        "add `keras.layers.Flatten()` before the layer (or reshape the data to (batch, "
                        f"{expected_value}))")
    if axis == -1 and got is not None:
        return (f"'{layer}' was built for {expected_value} features on the last axis and the input "
                f"{show_shape(found)} has {got}: the data's columns differ from those the model was built "
                "(or trained) with",
                f"give the data the {expected_value} features the model was built with (the same preprocessing and "
                f"columns as in training, e.g. the same one-hot categories), or build the model with "
                f"keras.Input(shape=(…, {got}))")
    return (f"axis {axis} of the input {show_shape(found)} has size {got}, where '{layer}' takes {expected_value}",
            f"make axis {axis} of the data {expected_value} long, or rebuild the layer for {got}")


_AXIS_NAMES = {3: ("batch", "timesteps", "features"), 4: ("batch", "height", "width", "channels")}


def shape_mismatch(expected: Shape, found: Shape) -> tuple[str, str]:
    """(cause, fix) for "expected shape=(None, 96, 96, 3), found shape=(None, 384, 384, 3)" (pure)."""
    if len(expected) != len(found):
        return rank_mismatch(len(expected), found, len(found))
    moved = _channels_moved(expected, found)
    if moved == "first":
        return (f"the input {show_shape(found)} is channels-first (batch, channels, height, width) and the model "
                f"takes {show_shape(expected)}, channels last",
                "transpose the batch: `x = np.transpose(x, (0, 2, 3, 1))` (or `tf.transpose`)")
    if moved == "last":
        return (f"the input {show_shape(found)} is channels-last and the model takes {show_shape(expected)}, "
                "channels first",
                "transpose the batch: `x = np.transpose(x, (0, 3, 1, 2))`, or build the model channels_last")
    differing = [i for i, (e, f) in enumerate(zip(expected, found)) if e is not None and f is not None and e != f]
    if len(expected) == 4 and differing == [3]:
        color = _color(expected[3], found[3])
        if color:
            return color
    if len(expected) == 4 and differing and set(differing) <= {1, 2}:
        return (f"the images are {_dims(found[1:3])} and the model was built for {_dims(expected[1:3])}",
                f"resize the images to {_dims(expected[1:3])} (`tf.image.resize`, `keras.layers.Resizing`), or build "
                "the model with keras.Input(shape=(None, None, channels)) if it has no Flatten/Dense on the feature map")
    if differing == [0]:
        return (f"the model was built with a fixed batch size of {expected[0]} and received a batch of {found[0]}",
                "build the model without a fixed batch size (keras.Input(shape=...) instead of batch_shape / "
                "batch_input_shape), or use drop_remainder=True in the pipeline")
    names = _AXIS_NAMES.get(len(expected))
    parts = [f"{names[i] if names else f'axis {i}'} {found[i]} instead of {expected[i]}" for i in differing]
    return (f"the input {show_shape(found)} differs from the model's {show_shape(expected)}: " + ", ".join(parts),
            f"shape the data as {show_shape(expected)} (the shape the model's Input declares), or rebuild the "
            f"model's Input for {show_shape(found)}")


@register
class KerasInputIncompatible(CrashExplanation):
    """
    ## What it does
    Explains Keras's "Input 0 of layer 'conv2d' is incompatible with the layer: expected …,
    found …" in words: which axis is missing (the batch axis of a single sample, the channel
    axis of grayscale images, the features axis of a sequence), channels-first data given to a
    channels-last model, RGBA or grayscale images where RGB is expected, images of another
    size, a feature map that was not flattened, or data with other columns than the model was
    built for. It names the layer (and, in a live run, its class) and the user's line.

    ## Why is this bad?
    The message states two shapes and leaves the meaning to the reader. The causes are few and
    each has a one-line fix, but which one applies depends on where the two shapes differ.

    ## Example
    ```python
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(8, 3), ...])
    model.fit(x_train, y_train)      # x_train: (60000, 28, 28) -- no channel axis
    ```

    ## Use instead
    ```python
    model.fit(x_train[..., None], y_train)       # (60000, 28, 28, 1)
    model.predict(image[None])                   # one image: add the batch axis
    ```

    ## References
    - Keras docs, the Input object and input shapes: https://keras.io/api/layers/core_layers/input/
    - Keras docs, Conv2D `data_format` (channels_last is the default): https://keras.io/api/layers/convolution_layers/convolution2d/
    - keras-team/keras#17368 and krasserm/super-resolution#74 (an RGBA image for an RGB model), as users report it.
    """

    code = "E134"
    name = "keras-input-incompatible"
    summary = "a Keras layer got an input of another shape or rank than it was built for"
    fix = "shape the data as the model's Input declares (batch axis first, channels last), or rebuild the Input for the data"
    patterns = (
        _LAYER + r":\s*expected shape=(?P<expected>" + _SHAPE + r"),\s*found shape=(?P<found>" + _SHAPE + r")",
        _LAYER + r":\s*expected axis (?P<axis>-?\d+) of input shape to have value (?P<value>\d+),?\s*but received "
                 r"input with shape (?P<found_axis>" + _SHAPE + r")",
        _LAYER + r":\s*expected (?P<rank_kind>(?:min_|max_)?ndim)=(?P<rank>\d+),\s*found ndim=(?P<found_rank>\d+)"
                 r"(?:\.\s*Full shape received:\s*(?P<full>" + _SHAPE + r"))?",
    )
    order = 30

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        text = plain(crash.text)
        for pattern in cls.patterns:
            found = re.search(pattern, text, re.S)
            if found:
                return {k: v for k, v in found.groupdict().items() if v is not None}
        return None

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        layer = facts.get("layer") or facts.get("layer2") or "?"
        evidence: dict[str, Any] = {"layer": layer}
        if "expected" in facts:
            expected, found = parse_shape(facts["expected"]), parse_shape(facts["found"])
            evidence.update({"expected_shape": expected, "found_shape": found})
            cause, fix = shape_mismatch(expected or [], found or [])
        elif "axis" in facts:
            found = parse_shape(facts["found_axis"]) or []
            axis, value = int(facts["axis"]), int(facts["value"])
            evidence.update({"axis": axis, "expected_value": value, "found_shape": found})
            cause, fix = axis_mismatch(axis, value, found, layer)
        else:
            rank, found_rank = int(facts["rank"]), int(facts["found_rank"])
            full = parse_shape(facts["full"]) if facts.get("full") else None
            evidence.update({facts["rank_kind"]: rank, "found_ndim": found_rank})
            if full is not None:
                evidence["found_shape"] = full
            if facts["rank_kind"] == "min_ndim" and found_rank > rank:
                found_rank = rank - 1  # cannot happen for min_ndim; keep the words consistent
            cause, fix = rank_mismatch(rank, full, found_rank)
        kind = _layer_class(crash, layer)
        if kind:
            evidence["layer_class"] = kind
        subject = f"Layer '{layer}'" + (f" ({kind})" if kind else "")
        message = f"{subject} cannot take its input: {cause}."
        return cls.make(crash, message, fix=fix, evidence=evidence)


def _layer_class(crash: Crash, name: str) -> str | None:
    """The class of the layer named in the message (live runs). Keras removes its own frames
    from the traceback, so the layer is found by name among the models in the user's frames."""
    if not crash.is_live:
        return None
    user_files = {f.path for f in crash.frames if f.is_user}
    seen: set[int] = set()
    for frame in reversed(crash.live_frames()):
        if frame.f_code.co_filename not in user_files:
            continue
        for value in list(frame.f_locals.values()):
            found = _find_layer(value, name, seen)
            if found is not None:
                return type(found).__name__
    return None


def _find_layer(value: Any, name: str, seen: set[int], depth: int = 0) -> Any:
    if depth > 6 or id(value) in seen or not hasattr(value, "input_spec") or not hasattr(value, "name"):
        return None
    seen.add(id(value))
    if getattr(value, "name", None) == name:
        return value
    try:
        children = list(getattr(value, "layers", []) or [])
    except Exception:  # noqa: BLE001 - a layer whose layers property fails: nothing to search
        return None
    for child in children:
        found = _find_layer(child, name, seen, depth + 1)
        if found is not None:
            return found
    return None
