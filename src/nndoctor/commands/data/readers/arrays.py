"""Choosing the image and label arrays in a container of named arrays (HDF5 file, .npz archive).

Shared by the HDF5 and NumPy readers: an image array is N×H×W, N×H×W×C or N×C×H×W (C in
1, 3, 4) or N encoded-bytes entries; a label array is one value per image. Names decide between
candidates (``images`` over ``masks``), and ``x_train``/``y_train``, ``train/images`` pair up
into splits (``train_set_x``/``train_set_y`` too). ``--images`` / ``--labels`` override the choice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nndoctor.commands.data.layout import SPLIT_NAMES
from nndoctor.util.errors import UsageError

IMAGE_NAMES = ("images", "image", "imgs", "img", "x", "data", "pixels", "features", "inputs", "input")
LABEL_NAMES = ("labels", "label", "y", "targets", "target", "classes", "class", "cls", "category")


@dataclass(frozen=True)
class ArrayInfo:
    name: str  # full name ("train/images", "x_train")
    shape: tuple[int, ...]
    kind: str  # numpy dtype kind: u i f b S V O
    encoded: bool  # one encoded image (bytes) per entry
    itemsize: int = 1  # bytes per number

    def describe(self) -> str:
        if self.encoded:
            return f"{self.shape[0]:,} encoded images"
        return "×".join(str(d) for d in self.shape) + f" {self.kind_name}"

    @property
    def kind_name(self) -> str:
        return {"u": "unsigned integers", "i": "integers", "f": "floats", "b": "booleans"}.get(self.kind, self.kind)


@dataclass(frozen=True)
class Pair:
    split: str | None  # a split named inside the container (train/, _test), or None
    images: ArrayInfo
    labels: ArrayInfo | None


def is_image_array(info: ArrayInfo) -> bool:
    if info.encoded:
        return len(info.shape) == 1 and info.shape[0] > 0
    if info.kind not in "uif" or not info.shape or info.shape[0] == 0:
        return False
    if len(info.shape) == 3:
        return min(info.shape[1:]) >= 2
    if len(info.shape) == 4:
        return info.shape[3] in (1, 3, 4) or info.shape[1] in (1, 3, 4)
    return False


def is_label_array(info: ArrayInfo, count: int) -> bool:
    if info.encoded or not info.shape or info.shape[0] != count:
        return False
    flat = len(info.shape) == 1 or (len(info.shape) == 2 and info.shape[1] == 1)
    return flat and info.kind in "uiSUO"


def _parts(name: str) -> tuple[str, str]:
    """(group, leaf) of a name: "train/images" → ("train", "images")."""
    group, _, leaf = name.strip("/").rpartition("/")
    return group, leaf


def _tokens(leaf: str) -> list[str]:
    return [t for t in re.split(r"[_\-. ]+", leaf.lower()) if t]


def _split_of(leaf: str) -> str | None:
    """"x_train" → "train"; "train_set_x" → "train"; "images" → None."""
    return next((t for t in _tokens(leaf) if t in SPLIT_NAMES), None)


def _rank(leaf: str, names: tuple[str, ...]) -> int:
    """How well a name says what it holds: "images" 0, "train_set_x" the rank of "x", else last."""
    words = [t for t in _tokens(leaf) if t not in SPLIT_NAMES] or [leaf.lower()]
    return min((names.index(w) for w in words if w in names), default=len(names))


def _split_in(info: ArrayInfo) -> str | None:
    group, leaf = _parts(info.name)
    return _split_of(leaf) or _split_of(group.rsplit("/", 1)[-1])


def choose(container: str, arrays: list[ArrayInfo], images: str | None, labels: str | None) -> list[Pair]:
    """The (images, labels) pairs to read; UsageError when none or when --images/--labels are wrong."""
    by_name = {a.name.strip("/"): a for a in arrays}
    listing = ", ".join(f"{a.name} ({a.describe()})" for a in arrays) or "none"
    if images is not None:
        chosen = by_name.get(images.strip("/"))
        if chosen is None or not is_image_array(chosen):
            raise UsageError(f"{container}: --images {images}: no image array of that name "
                             f"(arrays: {listing})")
        return [Pair(None, chosen, _labels_for(container, chosen, by_name, arrays, labels))]
    candidates = [a for a in arrays if is_image_array(a)]
    if not candidates:
        raise UsageError(f"{container}: no image array found (N×H×W[×C] numbers or encoded bytes; "
                         f"arrays: {listing}); pass --images KEY")
    # One per split named by a group or the array's name; otherwise the best-named candidate.
    splits: dict[str, ArrayInfo] = {}
    for info in sorted(candidates, key=lambda a: (_rank(_parts(a.name)[1], IMAGE_NAMES), a.encoded, a.name)):
        split = _split_in(info)
        if split is not None:
            splits.setdefault(split, info)
    if len(splits) > 1:
        return [Pair(split, info, _labels_for(container, info, by_name, arrays, labels))
                for split, info in sorted(splits.items())]
    best = min(candidates, key=lambda a: (_rank(_parts(a.name)[1], IMAGE_NAMES), a.encoded, a.name))
    return [Pair(_split_in(best), best, _labels_for(container, best, by_name, arrays, labels))]


def _labels_for(container: str, images: ArrayInfo, by_name: dict[str, ArrayInfo], arrays: list[ArrayInfo],
                labels: str | None) -> ArrayInfo | None:
    count = images.shape[0]
    if labels is not None:
        chosen = by_name.get(labels.strip("/"))
        if chosen is None or not is_label_array(chosen, count):
            raise UsageError(f"{container}: --labels {labels}: no array of {count:,} labels of that name "
                             f"(arrays: {', '.join(a.name for a in arrays)})")
        return chosen
    group, leaf = _parts(images.name)
    split = _split_of(leaf)
    found = [a for a in arrays if a is not images and _parts(a.name)[0] == group and is_label_array(a, count)
             and _rank(_parts(a.name)[1], LABEL_NAMES) < len(LABEL_NAMES)
             and _split_of(_parts(a.name)[1]) == split]
    return min(found, key=lambda a: _rank(_parts(a.name)[1], LABEL_NAMES)) if found else None


def label_text(value: object) -> str:
    """A label as the class name the report uses."""
    if hasattr(value, "tolist"):
        value = value.tolist()  # type: ignore[union-attr]
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
