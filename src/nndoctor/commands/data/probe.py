"""Inspect one image file: read it once, check its structure, decode it fully, measure it.

Runs in worker processes; returns a small, picklable, JSON-serialisable FileRecord and never
raises for a bad file (a bad file is the finding, not a crash).
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
from dataclasses import asdict, dataclass, fields

import numpy as np
from PIL import Image, UnidentifiedImageError

from nndoctor.commands.data.formats import IMAGE_FORMATS, sniff, structure_problem
from nndoctor.commands.data.imagestats import PHASH_SIZE, channel_moments, gray_std, phash
from nndoctor.commands.data.regular import NotARegularFile
from nndoctor.commands.data.storage import read_bytes

# Bump when what a record holds or how it is computed changes: old cache entries are ignored.
PROBE_VERSION = 1

# Pillow's own bomb limit (~89 Mpx): beyond it Pillow warns, beyond twice it refuses.
# Training loaders use the same limit, so a larger image is a failure waiting in the loader.
MAX_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485
# Statistics and hashes come from a reduced image; JPEG draft mode decodes at 1/2–1/8 scale
# directly in the IDCT, so large photos cost little more than small ones.
STATS_SIDE = 128
EXIF_ORIENTATION = 0x0112
_READ_LIMIT = 1 << 30  # a single "image" over 1 GiB is not read into memory


@dataclass(slots=True)
class FileRecord:
    """What the probe learned about one file. ``kind`` is image, other or unreadable."""

    kind: str
    size: int = 0
    content_format: str = ""
    reason: str = ""  # why it is unreadable
    mode: str = ""
    width: int = 0
    height: int = 0
    orientation: int = 0
    digest: str = ""  # blake2b-128 of the bytes
    phash: int | None = None
    gray_std: float | None = None
    moments: list[float] | None = None  # channel_moments() of the reduced image

    def to_json(self) -> list:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_json(cls, values: list) -> FileRecord:
        return cls(*values)

    @classmethod
    def valid_json(cls, values: object) -> bool:
        """True when ``values`` (e.g. a cache row) rebuilds a FileRecord with the right types."""
        if not isinstance(values, list) or len(values) != len(fields(cls)):
            return False
        number = (int, float)
        kinds: tuple[type | tuple[type, ...], ...] = (
            str, int, str, str, str, int, int, int, str, (int, type(None)), (*number, type(None)), (list, type(None)))
        for value, kind in zip(values, kinds):
            if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
                return False
        moments = values[-1]
        return moments is None or all(isinstance(m, number) for m in moments)

    def as_dict(self) -> dict:
        return asdict(self)


def unreadable(reason: str, **known) -> FileRecord:
    return FileRecord(kind="unreadable", reason=reason, **known)


def probe_file(path: str) -> FileRecord:
    """Everything nndoctor wants to know about one file, in one read."""
    try:
        # Not read(_READ_LIMIT): that reserves 1 GiB up front for every file.
        data = read_bytes(path, _READ_LIMIT)
    except FileNotFoundError:
        return unreadable("file disappeared during the scan (or is a broken symlink)")
    except PermissionError:
        return unreadable("permission denied")
    except IsADirectoryError:
        return unreadable("is a directory")
    except NotARegularFile as error:
        return unreadable(str(error))
    except OSError as error:
        return unreadable(f"read error: {error.strerror or error}")
    return probe_bytes(data)


def probe_bytes(data: bytes) -> FileRecord:
    """Everything nndoctor wants to know about one encoded image (a file's or a record's bytes)."""
    if not data:
        return unreadable("empty file (0 bytes)", content_format="empty")
    fmt = sniff(data[:64])
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    if fmt not in IMAGE_FORMATS:
        return FileRecord(kind="other", size=len(data), content_format=fmt, digest=digest)
    record = FileRecord(kind="image", size=len(data), content_format=fmt, digest=digest)
    problem = structure_problem(fmt, data)
    if problem:
        record.kind, record.reason = "unreadable", problem
        return record
    try:
        _decode_into(record, data)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        record.kind, record.reason = "unreadable", f"decompression bomb: {error}"
    except (OSError, SyntaxError, ValueError, UnidentifiedImageError, EOFError) as error:
        record.kind, record.reason = "unreadable", f"{fmt} does not decode: {error}"
    except MemoryError:
        record.kind, record.reason = "unreadable", "decoding ran out of memory"
    return record


def probe_pixels(pixels: np.ndarray) -> FileRecord:
    """The same facts for a decoded image held as an array (HDF5, NumPy): H×W, H×W×C or C×H×W."""
    array = np.asarray(pixels)
    if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
        array = np.moveaxis(array, 0, -1)  # channels first (PyTorch layout)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    digest = hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=16).hexdigest()
    record = FileRecord(kind="image", size=int(array.nbytes), content_format="array", digest=digest)
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)):
        record.kind, record.reason = "unreadable", f"array of shape {tuple(pixels.shape)} is not an image"
        return record
    if array.dtype.kind == "f":
        if not np.isfinite(array).all():
            record.kind, record.reason = "unreadable", "array holds NaN or infinite pixel values"
            return record
        # Floats on the 0–1 scale (already divided by 255) or the 0–255 scale.
        scale = 255.0 if float(array.max(initial=0.0)) <= 1.0 else 1.0
        array = (array * scale).clip(0, 255).astype(np.uint8)
    elif array.dtype != np.uint8:
        top = float(array.max(initial=0)) or 1.0
        array = (array.astype(np.float64) / top * 255).astype(np.uint8) if top > 255 else array.astype(np.uint8)
    try:
        image = Image.fromarray(array)
        record.mode, record.width, record.height = image.mode, image.width, image.height
        _measure(record, _to_rgb(_reduce(image)))
    except (ValueError, TypeError) as error:
        record.kind, record.reason = "unreadable", f"array does not convert to an image: {error}"
    return record


def _decode_into(record: FileRecord, data: bytes) -> None:
    with warnings.catch_warnings():
        # Pillow only warns between 1× and 2× its limit; the loader will see the same image.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        record.mode, record.width, record.height = image.mode, width, height
        if width * height > MAX_PIXELS:
            raise Image.DecompressionBombError(
                f"{width}x{height} = {width * height / 1e6:.0f} Mpx exceeds Pillow's "
                f"limit of {MAX_PIXELS / 1e6:.0f} Mpx"
            )
        record.orientation = _orientation(image)
        if image.format == "JPEG":
            image.draft("RGB", (STATS_SIDE, STATS_SIDE))
        image.load()  # full decode: a truncated or corrupt stream raises here
        rgb = _to_rgb(_reduce(image))
    _measure(record, rgb)


def _measure(record: FileRecord, rgb: Image.Image) -> None:
    gray = rgb.convert("L")
    record.gray_std = gray_std(gray.histogram())
    record.moments = channel_moments(rgb.histogram())
    # A blank image has no structure to hash; its "hash" would match every other blank one.
    if record.gray_std >= 1.0:
        small = gray.resize((PHASH_SIZE, PHASH_SIZE), Image.Resampling.BILINEAR)
        record.phash = phash(np.asarray(small))


def _orientation(image: Image.Image) -> int:
    try:
        return int(image.getexif().get(EXIF_ORIENTATION) or 0)
    except Exception:  # noqa: BLE001 - a broken EXIF block must not hide the pixels
        return 0


def _reduce(image: Image.Image) -> Image.Image:
    factor = max(1, min(image.size) // STATS_SIDE)
    if factor > 1 and image.mode not in ("P", "1"):
        try:
            return image.reduce(factor)
        except ValueError:
            pass
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I;16") or image.mode in ("I", "F"):
        # 16-bit and float images: scale to 8 bits by their own range for the statistics.
        array = np.asarray(image, dtype=np.float64)
        top = float(array.max()) or 1.0
        image = Image.fromarray((array / top * 255).astype(np.uint8))
    return image.convert("RGB")


def probe_batch(paths: list[str]) -> list[FileRecord]:
    """Worker entry point: one call per batch keeps inter-process traffic low."""
    return [probe_file(path) for path in paths]


def probe_stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
