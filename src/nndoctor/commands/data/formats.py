"""What a file's bytes are (by signature, not by name), and structural checks Pillow skips."""

from __future__ import annotations

import struct
import zlib

# Extensions torchvision's ImageFolder loads (torchvision.datasets.folder.IMG_EXTENSIONS) plus
# the other common image extensions; the value is the format the content should have.
IMAGE_EXTENSIONS: dict[str, str] = {
    ".jpg": "JPEG", ".jpeg": "JPEG", ".jpe": "JPEG", ".jfif": "JPEG",
    ".png": "PNG", ".ppm": "PPM", ".pgm": "PPM", ".pbm": "PPM", ".pnm": "PPM",
    ".bmp": "BMP", ".tif": "TIFF", ".tiff": "TIFF", ".webp": "WEBP", ".gif": "GIF",
}
# What ImageFolder's default is_valid_file accepts: anything else in a class folder is skipped.
IMAGEFOLDER_EXTENSIONS = frozenset(
    (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
)
# Formats whose content nndoctor decodes with Pillow.
IMAGE_FORMATS = frozenset(("JPEG", "PNG", "PPM", "BMP", "TIFF", "WEBP", "GIF"))


def sniff(head: bytes) -> str:
    """Name the content of a file from its first bytes ("JPEG", "PNG" … or a non-image kind)."""
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if head.startswith(b"BM") and len(head) >= 18:
        return "BMP"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "WEBP"
    if len(head) >= 3 and head[0:1] == b"P" and head[1:2] in b"123456" and head[2:3] in b" \t\r\n":
        return "PPM"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"heic", b"heix", b"mif1", b"msf1", b"heim", b"heis"):
            return "HEIC"
        if brand in (b"avif", b"avis"):
            return "AVIF"
        return "video (MP4/MOV)"
    if head.startswith(b"\x00\x05\x16\x07"):
        # macOS stores resource forks as "._name" beside the real file when copying to
        # non-HFS volumes; they carry the image's name and extension but no image.
        return "AppleDouble metadata"
    if head.startswith(b"%PDF"):
        return "PDF"
    if head.startswith(b"PK\x03\x04"):
        return "ZIP archive"
    if head.startswith(b"\x1f\x8b"):
        return "gzip archive"
    if head.startswith(b"Bud1", 4):
        return ".DS_Store"
    if head.startswith(b"\xd0\xcf\x11\xe0"):
        return "OLE (Thumbs.db / Office)"
    stripped = head.lstrip().lower()
    if stripped.startswith((b"<!doctype html", b"<html", b"<?xml", b"<svg")):
        return "HTML/XML" if not stripped.startswith(b"<svg") else "SVG"
    if _looks_like_text(head):
        return "text"
    return "unknown binary"


def _looks_like_text(head: bytes) -> bool:
    if not head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(b >= 0x20 or b in (0x09, 0x0A, 0x0D) for b in head)


def structure_problem(fmt: str, data: bytes) -> str | None:
    """Truncation or corruption that a successful Pillow decode can hide, or None.

    Pillow's ``Image.verify()`` does nothing for JPEG, and libjpeg fills a missing tail with
    grey while only printing a warning in some builds, so the end marker is checked here.
    PNG chunk CRCs are not verified by ``Image.load()``; they are here (zlib.crc32 is C speed).
    """
    if fmt == "JPEG":
        return _jpeg_problem(data)
    if fmt == "PNG":
        return _png_problem(data)
    return None


def _jpeg_problem(data: bytes) -> str | None:
    tail = data.rstrip(b"\x00\r\n ")  # some writers pad after EOI; harmless
    if tail.endswith(b"\xff\xd9"):
        return None
    # Cameras and phones append data (motion photos, MPF previews) after the main image's
    # EOI; an EOI followed by another JPEG/MP4 is fine, a file with no EOI at all is cut.
    if b"\xff\xd9" in data[-(1 << 20):] and _eoi_followed_by_trailer(data):
        return None
    return f"truncated JPEG: no end-of-image marker (FFD9) at the end of {len(data)} bytes"


def _eoi_followed_by_trailer(data: bytes) -> bool:
    position = data.rfind(b"\xff\xd9")
    trailer = data[position + 2 : position + 64]
    return trailer.startswith(b"\xff\xd8") or b"ftyp" in trailer[:16]


def _png_problem(data: bytes) -> str | None:
    position = 8
    size = len(data)
    while position + 8 <= size:
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        end = position + 12 + length
        if end > size:
            return (
                f"truncated PNG: chunk {kind.decode('latin-1')!r} at byte {position} needs "
                f"{length + 12} bytes, {size - position} left"
            )
        body = data[position + 4 : position + 8 + length]
        (stored,) = struct.unpack(">I", data[end - 4 : end])
        if zlib.crc32(body) != stored:
            return f"corrupt PNG: CRC mismatch in chunk {kind.decode('latin-1')!r} at byte {position}"
        if kind == b"IEND":
            return None
        position = end
    return "truncated PNG: no IEND chunk"
