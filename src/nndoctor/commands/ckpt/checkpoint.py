"""What a checkpoint file holds once read: its format, its state dicts, and how it was read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TensorInfo:
    """Shape and dtype of one stored tensor (works for torch tensors and numpy arrays)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        total = 1
        for dim in self.shape:
            total *= dim
        return total

    def shape_text(self) -> str:
        return "[" + ", ".join(str(d) for d in self.shape) + "]"

    @classmethod
    def of(cls, value: Any) -> TensorInfo:
        dtype = str(getattr(value, "dtype", "?")).replace("torch.", "")
        return cls(tuple(int(d) for d in getattr(value, "shape", ())), dtype)


@dataclass
class StateDict:
    """One flat mapping of parameter names to tensors found somewhere in the file.

    ``where`` is its path inside the file's container ("" for the root object,
    "state_dict" for Lightning, "model" for ``{"model": …, "optimizer": …}``).
    """

    where: str
    tensors: dict[str, Any]
    role: str = "weights"  # "weights", "whole-model" (pulled out of a pickled nn.Module)

    def infos(self) -> dict[str, TensorInfo]:
        return {key: TensorInfo.of(value) for key, value in self.tensors.items()}

    @property
    def parameter_count(self) -> int:
        return sum(TensorInfo.of(v).numel for v in self.tensors.values())


@dataclass
class Checkpoint:
    """A checkpoint file, read safely."""

    path: str
    format: str  # pytorch-zip, pytorch-legacy, pickle, safetensors, keras-*, torchscript
    root: Any = None
    state_dicts: list[StateDict] = field(default_factory=list)
    globals: list[str] = field(default_factory=list)
    unsafe_globals: list[str] = field(default_factory=list)
    read_mode: str = "weights_only"  # weights_only, placeholders, trusted, tensors-only
    whole_model_at: list[str] = field(default_factory=list)
    other_entries: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    keras_layers: list[Any] = field(default_factory=list)

    @property
    def primary(self) -> StateDict | None:
        """The state dict most likely to hold the model's weights."""
        if not self.state_dicts:
            return None
        preferred = ("state_dict", "model_state_dict", "model", "net", "network", "")
        for name in preferred:
            for sd in self.state_dicts:
                if sd.where == name and sd.tensors:
                    return sd
        return max(self.state_dicts, key=lambda sd: len(sd.tensors))

    def find(self, where: str) -> StateDict | None:
        for sd in self.state_dicts:
            if sd.where == where:
                return sd
        return None
