"""The scan itself: cache, read-only access, command line, units of the pure helpers."""

from __future__ import annotations

import json
import os

import numpy as np
from conftest import photo
from PIL import Image

from nndoctor.commands.data.filechecks import degenerate_reason, relatively_tiny_reason
from nndoctor.commands.data.formats import sniff, structure_problem
from nndoctor.commands.data.imagestats import hamming, phash
from nndoctor.commands.data.probe import FileRecord, probe_file


def snapshot(root) -> dict:
    return {
        p: (os.stat(p).st_size, os.stat(p).st_mtime_ns)
        for p in (os.path.join(d, f) for d, _, files in os.walk(root) for f in files)
    }


def test_cache_makes_rescan_read_only_new_files(build, run_data, cache_dir):
    root = build.imagefolder()
    first = run_data(root).report["extra"]["scan"]
    assert first["files_read"] == 18 and first["cache_hits"] == 0
    second = run_data(root).report["extra"]["scan"]
    assert second["files_read"] == 0 and second["cache_hits"] == 18
    build.image("train/cat/new.jpg")
    old = root / "train" / "dog" / "000.jpg"
    data = old.read_bytes()
    old.write_bytes(data[: len(data) // 2])  # a changed file must be re-read
    third = run_data(root)
    assert third.report["extra"]["scan"]["files_read"] == 2
    assert third.files("F101") == {"000.jpg"}
    assert (cache_dir / "data-scan.sqlite").exists()


def test_cached_results_give_the_same_findings(build, run_data):
    root = build.imagefolder()
    build.image("train/cat/gray.jpg", mode="L")
    first, second = run_data(root), run_data(root)
    assert second.report["extra"]["scan"]["cache_hits"] == 19
    assert [f["message"] for f in first.findings] == [f["message"] for f in second.findings]


def test_no_cache_writes_no_cache_and_the_dataset_is_never_written(build, run_data, cache_dir):
    root = build.imagefolder()
    before = snapshot(root)
    result = run_data(root, "--no-cache")
    assert result.report["extra"]["scan"]["cache"] is None
    assert not (cache_dir / "data-scan.sqlite").exists()
    run_data(root)
    assert snapshot(root) == before


def test_missing_path_is_a_usage_error(tmp_path, run_data):
    result = run_data(tmp_path / "nope")
    assert result.rc == 2 and "no such file or folder" in result.err


def test_bad_options_are_usage_errors(build, run_data):
    root = build.imagefolder(splits=("train",))
    assert run_data(root, "--crop", "0").rc == 2
    assert run_data(root, "--select", "not-a-check").rc == 2


def test_select_and_fail_on(build, run_data):
    root = build.imagefolder()
    build.image("train/cat/gray.jpg", mode="L")  # a warning only
    assert run_data(root).rc == 0
    assert run_data(root, "--fail-on", "warning").rc == 1
    selected = run_data(root, "--select", "F102")
    assert selected.codes() == {"F102"}


def test_json_to_stdout(build, capsys):
    from nndoctor.commands.data.cli import main

    root = build.imagefolder(splits=("train",))
    assert main([str(root), "--json", "-", "--workers", "1"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["command"][:2] == ["nndoctor", "data"] and report["status"] == "completed"
    assert "No problems found" not in captured.out and "F113" in captured.err


def test_file_deleted_during_scan_is_reported(tmp_path):
    record = probe_file(str(tmp_path / "vanished.jpg"))
    assert record.kind == "unreadable" and "disappeared" in record.reason


def test_record_roundtrips_through_json(tmp_path):
    path = tmp_path / "x.png"
    photo(3).save(path)
    record = probe_file(str(path))
    assert FileRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_sniff_and_structure():
    assert sniff(b"\xff\xd8\xff\xe0") == "JPEG" and sniff(b"\x89PNG\r\n\x1a\n") == "PNG"
    assert sniff(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "WEBP" and sniff(b"hello\n") == "text"
    assert structure_problem("JPEG", b"\xff\xd8\xff\xe0" + b"\x00" * 10) is not None
    assert structure_problem("JPEG", b"\xff\xd8\xff\xe0\x11\xff\xd9") is None


def test_phash_survives_resize_and_separates_distinct_images():
    def hash_of(image):
        gray = image.convert("L").resize((32, 32), Image.Resampling.BILINEAR)
        return phash(np.asarray(gray))

    original = photo(1, 160, 120)
    resized = original.resize((100, 75))
    assert hamming(hash_of(original), hash_of(resized)) <= 6
    distances = [hamming(hash_of(photo(s, 160, 120)), hash_of(photo(s + 1, 160, 120))) for s in range(10, 30)]
    assert min(distances) > 6


def test_relatively_tiny_threshold():
    assert relatively_tiny_reason(12, 12, 128).startswith("tiny for this dataset")
    assert relatively_tiny_reason(32, 40, 128) is None and relatively_tiny_reason(31, 40, 128) is not None


def test_degenerate_thresholds():
    assert degenerate_reason(FileRecord(kind="image", width=9, height=200)).startswith("tiny")
    assert degenerate_reason(FileRecord(kind="image", width=10, height=101)).startswith("extreme")
    assert degenerate_reason(FileRecord(kind="image", width=10, height=100, gray_std=5.0)) is None
