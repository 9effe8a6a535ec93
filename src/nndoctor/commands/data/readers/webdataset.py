"""WebDataset tar shards: members grouped by key (``0001.jpg`` + ``0001.cls`` is one sample).

The shard is read as a stream (``tarfile`` mode ``r|*``, so ``.tar.gz`` works and a remote shard
is fetched front to back once); a shard cut short yields the members before the cut and then a
record naming the member where the data ended.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator

from nndoctor.commands.data import storage
from nndoctor.commands.data.records import ReadOptions, Sample, SourceInfo, Unit

IMAGE_PREFERENCE = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "pbm", "bmp", "tif", "tiff", "gif")
IMAGE_EXTENSIONS = frozenset(IMAGE_PREFERENCE)
LABEL_EXTENSIONS = ("cls", "cls2", "label", "target", "index")
JSON_LABEL_KEYS = ("label", "cls", "class", "category", "target")
MAX_MEMBER = 1 << 30  # a member over 1 GiB is not read into memory


def plan(path: str, split: str, options: ReadOptions) -> SourceInfo:
    return SourceInfo(units=[Unit("webdataset", path, split)])


def split_key(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key is the path up to the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), (ext.lower() if dot else "")


def read(unit: Unit) -> Iterator[Sample]:
    last: str | None = None  # the last member met
    inside = False  # True while a member's data is being read
    group: dict[str, bytes] = {}
    key = None
    ended = 0
    with storage.open_input(unit.path) as raw:
        try:
            with tarfile.open(fileobj=raw, mode="r|*") as archive:
                for member in archive:
                    last = member.name
                    if not member.isfile():
                        continue
                    inside = True
                    member_key, ext = split_key(member.name)
                    if member_key != key:
                        yield from _samples(unit.path, key, group)
                        key, group = member_key, {}
                    if member.size > MAX_MEMBER:
                        inside = False
                        yield Sample(f"{unit.path}:{member.name}", None,
                                     problem=f"member of {member.size / 1e9:.1f} GB: not read")
                        continue
                    handle = archive.extractfile(member)
                    group[ext] = handle.read() if handle is not None else b""
                    inside = False
                ended = archive.offset
            if _cut_before_end_blocks(raw, ended):
                raise tarfile.ReadError("no end-of-archive blocks after the last member: the file was cut")
        except (tarfile.TarError, EOFError, OSError) as error:
            yield from _samples(unit.path, key, group)
            if last is None:
                yield Sample(unit.path, None, problem=f"tar shard without a complete member: empty or cut before "
                                                      f"its first header ({error})")
            else:
                where = "inside" if inside else "after"
                yield Sample(f"{unit.path}:{last}", None,
                             problem=f"truncated or corrupt tar shard: it breaks {where} this member ({error})")
            return
    yield from _samples(unit.path, key, group)


def _cut_before_end_blocks(raw, ended: int) -> bool:
    """A tar writer ends the archive with two zero blocks; a plain tar without them was cut
    on a block boundary (which tarfile reads as a clean end)."""
    raw.seek(0)
    if raw.read(2) == b"\x1f\x8b":
        return False  # compressed: the gzip stream's own end is checked by tarfile
    raw.seek(0, 2)
    return raw.tell() - ended < 2 * tarfile.BLOCKSIZE


def _samples(path: str, key: str | None, group: dict[str, bytes]) -> Iterator[Sample]:
    if key is None:
        return
    ext = primary_image(group)
    if ext is not None:
        yield Sample(f"{path}:{key}.{ext}", _label(group), group[ext], extension="." + ext.rsplit(".", 1)[-1])


def primary_image(group: dict[str, bytes]) -> str | None:
    """The extension of the sample's training image: a plain one (``jpg``, ``png`` …) first,
    else the first image member by name. Other image members of the sample — segmentation
    masks (``seg.png``), depth maps, extra views — are not the image the model is given, and
    checked beside the images they would be a grayscale minority, blank, duplicated: false alarms."""
    for ext in IMAGE_PREFERENCE:
        if ext in group:
            return ext
    compound = sorted(ext for ext in group if ext.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS)
    return compound[0] if compound else None


def _label(group: dict[str, bytes]) -> str | None:
    for ext in LABEL_EXTENSIONS:
        if ext in group:
            return group[ext].decode("utf-8", "backslashreplace").strip()
    if "json" in group:
        try:
            meta = json.loads(group["json"])
        except (ValueError, UnicodeDecodeError):
            return None
        if isinstance(meta, dict):
            for name in JSON_LABEL_KEYS:
                if isinstance(meta.get(name), (int, str)) and not isinstance(meta.get(name), bool):
                    return str(meta[name])
    return None
