"""Sharded tensors (``DTensor``: FSDP2's ``fully_shard``, tensor parallelism) seen by the checks.

A check reads a parameter or gradient through its local shard: the values this rank holds,
a plain tensor. Reading the whole tensor would need a collective in the user's process group,
which nndoctor never issues. Statistics that are per element (non-finite values, RMS, the
start of a tensor as a fingerprint) stay meaningful on a shard; a norm is the shard's norm.
"""

from __future__ import annotations

from typing import Any


def is_dtensor(tensor: Any) -> bool:
    return hasattr(tensor, "placements") and callable(getattr(tensor, "to_local", None))


def local_tensor(tensor: Any) -> Any:
    """The local shard of a ``DTensor``; any other tensor as it is."""
    return tensor.to_local() if is_dtensor(tensor) else tensor
