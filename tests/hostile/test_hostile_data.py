"""Hostile datasets for ``nndoctor data``: special files named like data, decompression bombs,
a damaged cache, absurd worker counts, bad output paths, escape sequences in file names."""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import sys
from pathlib import Path

import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
import files_harness as h  # noqa: E402

from nndoctor.commands.data.cli import main as data_main  # noqa: E402
from nndoctor.commands.data.crc32c import masked_crc32c  # noqa: E402


def frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def example(value: bytes) -> bytes:
    """A tf.train.Example {"x": bytes_list[value]} (hand-encoded protobuf)."""
    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2]) + _varint(len(payload)) + payload

    feature = field(1, field(1, value))
    entry = field(1, b"x") + field(2, feature)
    return field(1, field(1, entry))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def images(folder: Path, count: int = 4) -> Path:
    for cls in ("a", "b"):
        (folder / cls).mkdir(parents=True, exist_ok=True)
        for k in range(count):
            Image.new("RGB", (40, 32), (k * 40, 90, 200 if cls == "a" else 30)).save(folder / cls / f"{k}.png")
    return folder


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NNDOCTOR_CACHE_DIR", str(tmp_path / "cache"))


def run(capsys, tmp_path: Path, *argv: object) -> tuple[int, str, str, dict | None]:
    json_path = tmp_path / "report.json"
    args = [str(a) for a in argv]
    if "--json" not in args:
        args += ["--json", str(json_path)]
    code = data_main(args)
    captured = capsys.readouterr()
    report = json.loads(json_path.read_text()) if json_path.is_file() else None
    return code, captured.out, captured.err, report


def strings(value: object) -> list[str]:
    """Every string inside a parsed JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return []


def evidence_text(report: dict) -> str:
    return json.dumps(report["findings"], ensure_ascii=False)


# -- 8 and 6: special files and bombs, in one subprocess under RLIMIT_AS and a timeout ---------
@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> dict[str, h.Limited]:
    root = tmp_path_factory.mktemp("hostile-data")
    cases: dict[str, tuple] = {}

    def folder(name: str) -> Path:
        path = root / name
        path.mkdir()
        return path

    good = frame(example(b"ok"))
    fifo_dir = folder("fifo-dir")
    (fifo_dir / "good.tfrecord").write_bytes(good)
    os.mkfifo(fifo_dir / "stuck.tfrecord")
    cases["fifo-in-folder"] = ("data", fifo_dir, "--json", root / "fifo-dir.json")
    os.mkfifo(root / "alone.tfrecord")
    cases["fifo-given"] = ("data", root / "alone.tfrecord")
    for device in ("zero", "urandom"):
        dev_dir = folder(f"dev-{device}")
        (dev_dir / "good.tfrecord").write_bytes(good)
        os.symlink(f"/dev/{device}", dev_dir / f"{device}.tfrecord")
        cases[f"dev-{device}-in-folder"] = ("data", dev_dir, "--json", root / f"dev-{device}.json")
        cases[f"dev-{device}-glob"] = ("data", str(dev_dir / "*.tfrecord"), "--json", root / f"glob-{device}.json")
    image_dir = images(folder("images"))
    os.mkfifo(image_dir / "a" / "stuck.jpg")
    os.symlink("/dev/zero", image_dir / "b" / "zero.png")
    cases["special-in-image-folder"] = ("data", image_dir, "--json", root / "images.json")
    # 1.5 GB record in a ~1.5 MB gzip file.
    length = struct.pack("<Q", 1_500_000_000)
    bomb_dir = folder("bomb")
    h.gzip_bomb(bomb_dir / "bomb.tfrecord.gz", length + struct.pack("<I", masked_crc32c(length)), 1_500_000_016)
    assert (bomb_dir / "bomb.tfrecord.gz").stat().st_size < 2_000_000
    cases["gzip-bomb"] = ("data", bomb_dir / "bomb.tfrecord.gz", "--json", root / "bomb.json")
    return dict(zip(cases, h.run_limited(list(cases.values()), cwd=root)))


@pytest.mark.parametrize("case", ["fifo-in-folder", "dev-zero-in-folder", "dev-urandom-in-folder",
                                  "dev-zero-glob", "dev-urandom-glob"])
def test_special_files_named_tfrecord_are_skipped_and_reported(limited, case):
    result = limited[case]
    assert result.code in (0, 1), result.err
    assert result.seconds < h.TIME_LIMIT_S
    assert result.json["extra"]["scan"]["tfrecord_records"] == 1  # the good file was read
    assert "not a regular file" in evidence_text(result.json)


def test_special_file_given_directly_is_a_one_line_error(limited):
    result = limited["fifo-given"]
    assert result.code == 2 and "FIFO" in result.err and result.err.count("\n") == 1


def test_special_files_in_an_image_folder_are_never_opened(limited):
    result = limited["special-in-image-folder"]
    assert result.code in (0, 1), result.err
    assert result.seconds < h.TIME_LIMIT_S
    text = evidence_text(result.json)
    assert "stuck.jpg" in text and "zero.png" in text and "not a regular file" in text
    assert result.json["extra"]["scan"]["files_scanned"] == 8


def test_gzip_tfrecord_bomb_is_reported_not_read(limited):
    result = limited["gzip-bomb"]
    assert result.seconds < h.TIME_LIMIT_S
    assert result.code == 1, result.err
    assert "Traceback" not in result.err and "MemoryError" not in result.err
    corrupt = [f for f in result.json["findings"] if f["code"] == "F201"]
    assert corrupt and "read limit" in corrupt[0]["message"]


def test_gzip_bomb_against_a_lowered_limit(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NNDOCTOR_MAX_RECORD_MB", "1")
    length = struct.pack("<Q", 8 << 20)
    h.gzip_bomb(tmp_path / "b.tfrecord.gz", length + struct.pack("<I", masked_crc32c(length)), (8 << 20) + 16)
    code, _out, _err, report = run(capsys, tmp_path, tmp_path / "b.tfrecord.gz")
    assert code == 1
    assert "NNDOCTOR_MAX_RECORD_MB" in evidence_text(report)


# -- 13. empty TFRecord ----------------------------------------------------------------------
def test_zero_byte_tfrecord_is_reported(tmp_path, capsys):
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    (tmp_path / "good.tfrecord").write_bytes(frame(example(b"ok")))
    code, _out, err, report = run(capsys, tmp_path, tmp_path / "empty.tfrecord", tmp_path / "good.tfrecord")
    assert code == 1, err
    corrupt = [f for f in report["findings"] if f["code"] == "F201"]
    assert corrupt and "empty file (0 bytes)" in corrupt[0]["message"]


# -- 10. worker count ------------------------------------------------------------------------
def test_absurd_worker_count_is_capped_and_said(tmp_path, capsys):
    from nndoctor.commands.data.scan import available_cpus

    folder = images(tmp_path / "imgs", count=2)
    code, _out, err, report = run(capsys, tmp_path, folder, "--workers", "100000")
    assert code in (0, 1)
    assert f"--workers 100000 capped at {available_cpus()}" in err
    assert report["extra"]["scan"]["workers"] == available_cpus()


# -- 11. damaged cache -------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["wrong-shape", "wrong-types", "not-json"])
def test_malformed_cache_rows_degrade_to_no_cache(tmp_path, capsys, damage):
    folder = images(tmp_path / "imgs", count=3)
    (folder / "r.tfrecord").write_bytes(frame(example(b"ok")))
    first = run(capsys, tmp_path, folder, tmp_path / "imgs" / "r.tfrecord")
    database = tmp_path / "cache" / "data-scan.sqlite"
    assert database.exists()
    value = {"wrong-shape": "[1, 2]", "wrong-types": json.dumps(["image", "big", "", "", "RGB", 1, 1, 0, "",
                                                                  None, None, None]),
             "not-json": "{not json"}[damage]
    with sqlite3.connect(database) as db:
        db.execute("UPDATE results SET result = ?", (value,))
    code, _out, err, report = run(capsys, tmp_path, folder, tmp_path / "imgs" / "r.tfrecord")
    assert code == first[0]
    assert "cache disabled" in err and "Traceback" not in err
    assert report["extra"]["scan"]["files_scanned"] == first[3]["extra"]["scan"]["files_scanned"]
    assert report["extra"]["scan"]["cache_hits"] == 0
    assert sorted(f["code"] for f in report["findings"]) == sorted(f["code"] for f in first[3]["findings"])


# -- 12. output paths --------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["directory", "below-a-file", "sysfs"])
def test_json_output_problems_are_one_line_errors(tmp_path, capsys, target):
    folder = images(tmp_path / "imgs", count=2)
    (tmp_path / "afile").write_text("x")
    json_path = {"directory": tmp_path, "below-a-file": tmp_path / "afile" / "r.json",
                 "sysfs": Path("/sys/nndoctor-report.json")}[target]
    code, out, err, _ = run(capsys, tmp_path, folder, "--json", json_path)
    assert code == 2, err
    assert err.startswith("nndoctor: error: ") and err.count("\n") == 1
    assert "Traceback" not in out + err


# -- 4. escape sequences in file names ---------------------------------------------------------
HOSTILE_NAME = "\x1b]0;owned\x07\x1b[2Jbad\r.png"


def test_escape_sequences_in_file_names(tmp_path, capsys):
    folder = images(tmp_path / "imgs", count=3)
    (folder / "a" / HOSTILE_NAME).write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)  # undecodable
    code, out, err, report = run(capsys, tmp_path, folder)
    assert code == 1
    assert any(HOSTILE_NAME in text for text in strings(report["findings"]))  # JSON keeps the raw name
    from nndoctor.report import terminal

    if "printable" not in open(terminal.__file__).read():
        pytest.skip("report/terminal.py does not escape finding text yet (harden-run's part of issue 12)")
    h.assert_no_raw_controls(out + err)


# -- 8. the readers themselves never block, even when a path is swapped after the walk ----------
@pytest.mark.parametrize("reader", ["image-probe", "tfrecord-scan"])
def test_readers_refuse_a_fifo_without_blocking(tmp_path, reader):
    import threading

    from nndoctor.commands.data.probe import probe_file
    from nndoctor.commands.data.tfrecord import scan_tfrecord

    fifo = tmp_path / "swapped.tfrecord"
    os.mkfifo(fifo)
    results: list = []
    read = (lambda: probe_file(str(fifo))) if reader == "image-probe" else (lambda: scan_tfrecord(str(fifo)))
    worker = threading.Thread(target=lambda: results.append(read()), daemon=True)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():  # unblock the reader so the test process can end
        with open(fifo, "wb"):
            pass
        pytest.fail("the reader blocked on a FIFO")
    text = json.dumps(results[0] if isinstance(results[0], dict) else results[0].as_dict())
    assert "not a regular file" in text
