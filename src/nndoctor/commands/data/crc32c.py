"""CRC32C (Castagnoli) and the TFRecord CRC mask.

Uses google-crc32c (hardware-accelerated, maintained by Google) when installed; otherwise a
table-driven pure-Python fallback that gives the same values, only slower.
"""

from __future__ import annotations

from types import ModuleType

_google: ModuleType | None
try:
    import google_crc32c as _google
except ImportError:  # pragma: no cover - exercised by tests through the fallback directly
    _google = None

_POLY = 0x82F63B78  # reflected Castagnoli polynomial
_MASK_DELTA = 0xA282EAD8


def _make_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _make_table()


def crc32c_python(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc32c(data: bytes) -> int:
    if _google is not None:
        return _google.value(bytes(data))
    return crc32c_python(data)


def masked_crc32c(data: bytes) -> int:
    """The CRC TFRecord stores: rotated right by 15 bits plus a constant (TF's crc32c::Mask)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF
