"""Per-file verdicts: what one probed file says on its own (F101, F104, F105, F111, F112).

Pure functions of a path and its FileRecord, so thresholds are unit-testable.
"""

from __future__ import annotations

import os

from nndoctor.commands.data.formats import IMAGE_EXTENSIONS, IMAGEFOLDER_EXTENSIONS
from nndoctor.commands.data.probe import FileRecord

# F112 thresholds (justified in DegenerateImage's documentation).
TINY_SIDE = 10  # px: below this an image carries almost no information (icons, pixels)
EXTREME_ASPECT = 10.0  # longer / shorter side: strips, banners, panoramas
BLANK_GRAY_STD = 1.0  # grayscale std on 0–255: one flat colour (failed loads, black frames)
# Tiny for its dataset: a shorter side under a quarter of the dataset's median shorter side
# (a 12x12 icon among 128-px photos is upsampled 10x by the same Resize as the rest), judged
# once enough images give a meaningful median.
RELATIVE_TINY = 0.25
RELATIVE_MIN_IMAGES = 8

_ORIENTATIONS = {
    2: "mirrored horizontally",
    3: "upside down (rotated 180°)",
    4: "mirrored vertically",
    5: "transposed (mirrored + rotated 90°)",
    6: "stored sideways (displays rotated 90° clockwise)",
    7: "transversed (mirrored + rotated 270°)",
    8: "stored sideways (displays rotated 90° counter-clockwise)",
}


def extension(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def per_file_issues(path: str, record: FileRecord) -> list[tuple[str, str]]:
    """``[(code, detail)]`` for one file; cross-file checks come later, from the index."""
    return record_issues(record, extension(path))


def record_issues(record: FileRecord, ext: str | None) -> list[tuple[str, str]]:
    """``[(code, detail)]`` for one file or record. ``ext`` is None for records that have no
    name (an HDF5 row, a Parquet cell): they are meant to be images, so anything else is F101,
    and there is no extension to compare the content with."""
    if record.kind == "unreadable":
        return [("F101", record.reason)]
    if record.kind == "other":
        if ext is None or ext in IMAGEFOLDER_EXTENSIONS or ext in IMAGE_EXTENSIONS:
            # Named like an image (or a record of images), so the loader will try to decode it.
            return [("F101", f"not an image: the content is {record.content_format}")]
        return [("F105", f"{record.content_format} file")]
    issues = []
    expected = IMAGE_EXTENSIONS.get(ext) if ext is not None else None
    if ext is None:
        pass
    elif expected is None:
        shown = f"'{ext}'" if ext else "no extension"
        issues.append(("F104", f"{record.content_format} content with {shown}: ImageFolder skips it"))
    elif expected != record.content_format:
        issues.append(("F104", f"{record.content_format} content named {ext}"))
    if record.orientation in _ORIENTATIONS:
        issues.append(("F111", f"EXIF orientation {record.orientation}: {_ORIENTATIONS[record.orientation]}"))
    degenerate = degenerate_reason(record)
    if degenerate:
        issues.append(("F112", degenerate))
    return issues


def degenerate_reason(record: FileRecord) -> str | None:
    width, height = record.width, record.height
    if min(width, height) < TINY_SIDE:
        return f"tiny: {width}x{height} px"
    aspect = max(width, height) / max(1, min(width, height))
    if aspect > EXTREME_ASPECT:
        return f"extreme aspect ratio {aspect:.1f}:1 ({width}x{height})"
    if record.gray_std is not None and record.gray_std < BLANK_GRAY_STD:
        return f"blank: one flat colour (grayscale std {record.gray_std:.2f} of 255)"
    return None


def relatively_tiny_reason(width: int, height: int, median_shorter: float) -> str | None:
    """Why an image is tiny next to the others (pure): its shorter side is under
    ``RELATIVE_TINY`` of the dataset's median shorter side."""
    shorter = min(width, height)
    if median_shorter <= 0 or shorter >= RELATIVE_TINY * median_shorter:
        return None
    return (f"tiny for this dataset: {width}x{height} px, shorter side {shorter} px against a median "
            f"of {median_shorter:g} px ({median_shorter / max(1, shorter):.0f}x smaller)")
