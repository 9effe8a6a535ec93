"""Builders for small on-disk datasets with injected defects, and a runner for the command."""

from __future__ import annotations

import gzip
import json
import random
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from nndoctor.commands.data.cli import main as data_main


def photo(seed: int, width: int = 72, height: int = 64, mode: str = "RGB") -> Image.Image:
    """A small photo-like picture: gradient, a few shapes, noise. Distinct for each seed."""
    rng = random.Random(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack(
        [rng.uniform(40, 200) + 60 * (np.cos(a) * x / width + np.sin(a) * y / height)
         for a in (rng.uniform(0, 6.3) for _ in range(3))], -1,
    )
    image = Image.fromarray(base.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x0, y0 = rng.uniform(0, width), rng.uniform(0, height)
        box = (x0, y0, x0 + rng.uniform(8, width / 2), y0 + rng.uniform(8, height / 2))
        color = tuple(rng.randint(0, 255) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=color)
    noise = np.random.default_rng(seed).normal(0, 4, (height, width, 3))
    image = Image.fromarray((np.asarray(image, np.float32) + noise).clip(0, 255).astype(np.uint8))
    return image if mode == "RGB" else image.convert(mode)


class DatasetBuilder:
    """Writes ImageFolder trees under one tmp folder; every image gets a fresh seed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seed = 0

    def image(self, relative: str, fmt: str = "JPEG", **kwargs) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        self.seed += 1
        photo(self.seed, **kwargs).save(path, fmt)
        return path

    def imagefolder(
        self, splits=("train", "val"), classes=("cat", "dog", "owl"), per_class=4, size=(72, 64)
    ) -> Path:
        for split in splits:
            for cls in classes:
                count = per_class if split == "train" else max(2, per_class // 2)
                for k in range(count):
                    self.image(f"{split}/{cls}/{k:03d}.jpg", width=size[0], height=size[1])
        return self.root


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch) -> Path:
    # Never touch the real ~/.cache during tests.
    folder = tmp_path_factory.mktemp("nndoctor-cache")
    monkeypatch.setenv("NNDOCTOR_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def build(tmp_path) -> DatasetBuilder:
    return DatasetBuilder(tmp_path / "data")


class Result:
    def __init__(self, rc: int, report: dict, out: str, err: str, *, argv: list[str] | None = None,
                 tmp_path: Path | None = None, test_name: str = "") -> None:
        self.rc, self.report, self.out, self.err = rc, report, out, err
        self.argv, self.tmp_path, self.test_name = argv or [], tmp_path, test_name

    def snapshot(self, code: str, suffix: str = "") -> None:
        """Compare the terminal text of this code's findings with tests/snapshots/data/ (the
        findings come back from the JSON report, whose values render as the originals do)."""
        from nndoctor.run.distributed.merge import finding_from_json
        from tests.snapshot import Normalizer, assert_findings_snapshot

        name = re.sub(r"[^\w.-]+", "-", self.test_name.removeprefix("test_")).strip("-") + f".{code}{suffix}"
        shown = " ".join(Normalizer(self.tmp_path).text(a) for a in self.argv)
        assert_findings_snapshot(f"data/{name}", [finding_from_json(f) for f in self.by_code(code)],
                                 base=self.tmp_path, source=f"nndoctor data {shown}")

    @property
    def findings(self) -> list[dict]:
        return self.report["findings"]

    def codes(self) -> set[str]:
        return {f["code"] for f in self.findings}

    def by_code(self, code: str) -> list[dict]:
        return [f for f in self.findings if f["code"] == code]

    def one(self, code: str) -> dict:
        found = self.by_code(code)
        assert len(found) == 1, f"expected one {code} finding, got {found}"
        return found[0]

    def files(self, code: str) -> set[str]:
        return {Path(p).name for f in self.by_code(code) for p in f["evidence"]["files"]}

    def serious(self) -> list[dict]:
        return [f for f in self.findings if f["severity"] in ("error", "warning")]


@pytest.fixture
def run_data(tmp_path, capsys, request):
    """Run ``nndoctor data`` in-process (one worker unless given) and return its JSON report."""

    def runner(*args: str | Path, workers: int = 1) -> Result:
        json_path = tmp_path / f"report-{random.random()}.json"
        argv = [str(a) for a in args] + ["--json", str(json_path)]
        if "--workers" not in argv:
            argv += ["--workers", str(workers)]
        rc = data_main(argv)
        captured = capsys.readouterr()
        report = json.loads(json_path.read_text(encoding="utf-8")) if json_path.exists() else {}
        return Result(rc, report, captured.out, captured.err, argv=[str(a) for a in args],
                      tmp_path=tmp_path, test_name=request.node.name)

    return runner


# -- TFRecord writing, independent of nndoctor's reader ------------------------------------
def crc32c_bitwise(data: bytes) -> int:
    """CRC-32C computed bit by bit (no table), as a check on the implementation under test."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    crc = crc32c_bitwise(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(features: dict) -> bytes:
    """Serialize a tf.train.Example; values: bytes → BytesList, float → FloatList, int → Int64List."""
    entries = b""
    for key, values in features.items():
        values = values if isinstance(values, list) else [values]
        if all(isinstance(v, bytes) for v in values):
            feature = _field(1, b"".join(_field(1, v) for v in values))
        elif all(isinstance(v, float) for v in values):
            feature = _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)))
        else:
            feature = _field(3, _field(1, b"".join(_varint(v) for v in values)))
        entries += _field(1, _field(1, key.encode()) + _field(2, feature))
    return _field(1, entries)


def frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked(length)) + data + struct.pack("<I", masked(data))


def write_tfrecord(path: Path, records: list[bytes], compress: bool = False) -> Path:
    payload = b"".join(frame(r) for r in records)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


def jpeg_bytes(seed: int, size: int = 32) -> bytes:
    import io

    buffer = io.BytesIO()
    photo(seed, size, size).save(buffer, "JPEG")
    return buffer.getvalue()
