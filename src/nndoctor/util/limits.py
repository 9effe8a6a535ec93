"""Size and depth limits for reading untrusted files: hostile input ends in a clear message, not a hang.

The defaults are far above what real checkpoints and datasets need (docs/limits.md says why each
was chosen) and far below what a decompression or allocation bomb asks for. Each can be changed
with an environment variable, e.g. ``NNDOCTOR_MAX_INFLATE_MB=4096 nndoctor ckpt inspect big.pt``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_MB = 1 << 20


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        return default
    return value if value > 0 else default


@dataclass(frozen=True)
class ReadLimits:
    """Limits applied while reading one untrusted file."""

    # Bytes a compressed member (a zip entry, a gzip stream) may inflate to before it is refused.
    max_inflate_bytes: int = 512 * _MB
    # Bytes one object built while unpickling may allocate (bytearray(n), a numpy array's shape).
    max_alloc_bytes: int = 512 * _MB
    # Objects visited when walking a loaded object graph.
    max_nodes: int = 200_000
    # Bytes one TFRecord record may hold (read into memory whole, inflated when the file is gzip).
    max_record_bytes: int = 256 * _MB

    @classmethod
    def from_env(cls) -> ReadLimits:
        return cls(
            max_inflate_bytes=_env_int("NNDOCTOR_MAX_INFLATE_MB", cls.max_inflate_bytes // _MB) * _MB,
            max_alloc_bytes=_env_int("NNDOCTOR_MAX_ALLOC_MB", cls.max_alloc_bytes // _MB) * _MB,
            max_nodes=_env_int("NNDOCTOR_MAX_NODES", cls.max_nodes),
            max_record_bytes=_env_int("NNDOCTOR_MAX_RECORD_MB", cls.max_record_bytes // _MB) * _MB,
        )


def megabytes(n: int) -> str:
    return f"{n / _MB:,.1f} MB" if n >= _MB else f"{n:,} bytes"
