"""Each image check fires on its injected defect, names the right files, and stays quiet otherwise."""

from __future__ import annotations

import os

import pytest
from conftest import photo
from PIL import Image


def test_clean_dataset_has_no_error_or_warning(build, run_data):
    root = build.imagefolder()
    result = run_data(root)
    assert result.rc == 0
    assert result.serious() == []
    assert result.codes() == {"F113"}  # the statistics, as info
    assert result.report["status"] == "completed" and result.report["steps"] == 0
    assert result.report["extra"]["scan"]["files_scanned"] == 18


def test_clean_dataset_with_two_workers_gives_the_same_report(build, run_data):
    root = build.imagefolder()
    one, two = run_data(root, "--no-cache", workers=1), run_data(root, "--no-cache", workers=2)
    assert two.report["extra"]["scan"]["workers"] == 2
    assert [f["message"] for f in one.findings] == [f["message"] for f in two.findings]


def test_f101_unreadable_files_are_named_with_their_reason(build, run_data):
    root = build.imagefolder(splits=("train",))
    cat = root / "train" / "cat"
    good = (cat / "000.jpg").read_bytes()
    (cat / "cut.jpg").write_bytes(good[: len(good) // 2])
    (cat / "empty.jpg").write_bytes(b"")
    (cat / "._000.jpg").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ")
    (cat / "page.jpg").write_bytes(b"<!DOCTYPE html><html><body>403 Forbidden</body></html>")
    png = build.image("train/dog/crc.png", fmt="PNG")
    data = bytearray(png.read_bytes())
    data[60] ^= 0xFF  # inside the first IDAT chunk
    png.write_bytes(bytes(data))
    result = run_data(root)
    finding = result.one("F101")
    assert result.rc == 1
    assert result.files("F101") == {"cut.jpg", "empty.jpg", "._000.jpg", "page.jpg", "crc.png"}
    reasons = {os.path.basename(k): v for k, v in finding["evidence"]["reasons"].items()}
    assert "end-of-image" in reasons["cut.jpg"]
    assert "0 bytes" in reasons["empty.jpg"]
    assert "AppleDouble" in reasons["._000.jpg"]
    assert "HTML" in reasons["page.jpg"]
    assert "CRC" in reasons["crc.png"]
    assert "cut.jpg" in result.out.replace("\n", "")  # the terminal names the first files
    result.snapshot("F101")


def test_f101_decompression_bomb_is_reported_not_decoded(build, run_data):
    root = build.imagefolder(splits=("train",), classes=("a", "b"))
    # 9500×9500 1-bit PNG: a few kB on disk, 90 Mpx (above Pillow's 89 Mpx limit).
    Image.new("1", (9500, 9500)).save(root / "train" / "a" / "bomb.png")
    result = run_data(root)
    assert result.files("F101") == {"bomb.png"}
    assert "decompression bomb" in result.one("F101")["message"]
    result.snapshot("F101")


def test_f101_broken_symlink_and_symlink_loop_do_not_stop_the_scan(build, run_data):
    root = build.imagefolder(splits=("train",))
    os.symlink(root / "train" / "cat" / "gone.jpg", root / "train" / "cat" / "dangling.jpg")
    os.symlink(root / "train", root / "train" / "dog" / "loop")
    result = run_data(root)
    assert {"dangling.jpg", "loop"} <= result.files("F101")
    reasons = " ".join(result.one("F101")["evidence"]["reasons"].values())
    assert "symlink loop" in reasons and "broken symlink" in reasons
    result.snapshot("F101")


def test_f101_unreadable_folder_is_reported(build, run_data, monkeypatch):
    root = build.imagefolder(splits=("train",))
    locked = str(root / "train" / "owl" / "locked")
    os.mkdir(locked)
    real_scandir = os.scandir

    def scandir(path="."):
        # Tests run as root, where chmod 000 does not stop reading; simulate the denial.
        if str(path) == locked:
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    result = run_data(root)
    assert result.files("F101") == {"locked"}
    assert "Permission denied" in result.one("F101")["message"]
    result.snapshot("F101")


def test_f101_non_utf8_name_is_a_warning_that_json_can_carry(build, run_data):
    root = build.imagefolder(splits=("train",))
    name = os.fsdecode(b"caf\xe9.jpg")
    photo(99).save(os.path.join(root, "train", "cat", name), "JPEG")
    result = run_data(root)
    finding = result.one("F101")
    assert finding["severity"] == "warning"
    assert finding["evidence"]["files"][0].endswith("caf\\xe9.jpg")
    result.snapshot("F101")


def test_f102_mixed_color_modes(build, run_data):
    root = build.imagefolder()
    build.image("train/cat/gray.jpg", mode="L")
    build.image("val/dog/alpha.png", fmt="PNG", mode="RGBA")
    result = run_data(root)
    assert result.files("F102") == {"gray.jpg", "alpha.png"}
    assert result.one("F102")["evidence"]["modes"] == {"RGB": 18, "L": 1, "RGBA": 1}
    result.snapshot("F102")


def test_f103_images_smaller_than_the_crop(build, run_data):
    root = build.imagefolder()
    build.image("train/owl/thumb.jpg", width=40, height=30)
    result = run_data(root, "--crop", "56")
    assert result.files("F103") == {"thumb.jpg"}
    assert result.one("F103")["severity"] == "warning"
    result.snapshot("F103", ".crop")
    without_crop = run_data(root)
    without_crop.snapshot("F103")
    spread = without_crop.one("F103")  # without --crop: the spread, as info
    assert spread["severity"] == "info" and spread["evidence"]["smallest"][1:] == [40, 30]


def test_f104_content_differs_from_extension(build, run_data):
    root = build.imagefolder()
    build.image("train/cat/really_png.jpg", fmt="PNG")
    build.image("train/dog/no_extension", fmt="JPEG")
    result = run_data(root)
    assert result.files("F104") == {"really_png.jpg", "no_extension"}
    reasons = " ".join(result.one("F104")["evidence"]["reasons"].values())
    assert "PNG content named .jpg" in reasons and "ImageFolder skips it" in reasons
    result.snapshot("F104")


def test_f105_stray_non_image_files(build, run_data):
    root = build.imagefolder()
    (root / "train" / "cat" / "notes.txt").write_text("labels checked by Anna\n")
    (root / "val" / "dog" / "images.zip").write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    result = run_data(root)
    assert result.files("F105") == {"notes.txt", "images.zip"}
    assert result.one("F105")["severity"] == "warning"
    result.snapshot("F105")


def test_f106_phantom_class_directories(build, run_data):
    root = build.imagefolder()
    build.image("train/.ipynb_checkpoints/000-checkpoint.jpg")
    (root / "val" / "__MACOSX").mkdir()
    result = run_data(root)
    finding = result.one("F106")
    assert result.files("F106") == {".ipynb_checkpoints", "__MACOSX"}
    assert "class 0 of 4, 1 file" in finding["message"]
    assert result.rc == 1
    # The checkpoint copy is not counted as a sample of a real class.
    assert "F109" not in result.codes()
    result.snapshot("F106")


def test_f107_split_class_lists_differ(build, run_data):
    root = build.imagefolder()
    for path in (root / "val" / "dog").iterdir():
        path.unlink()
    (root / "val" / "dog").rmdir()
    build.image("val/zebra/000.jpg")
    build.image("val/zebra/001.jpg")
    result = run_data(root)
    result.snapshot("F107")
    finding = result.one("F107")
    assert finding["evidence"]["missing"] == ["dog"] and finding["evidence"]["extra"] == ["zebra"]
    assert "owl: 2 in train, 1 in val" in finding["evidence"]["shifted"]
    assert finding["location"]["path"].endswith("val")


def test_f108_empty_and_tiny_classes(build, run_data):
    root = build.imagefolder(splits=("train",), per_class=12)
    (root / "train" / "empty").mkdir()
    build.image("train/rare/000.jpg")
    result = run_data(root)
    result.snapshot("F108")
    finding = result.one("F108")
    assert finding["evidence"]["empty"] == ["empty"]
    assert finding["evidence"]["under_represented"] == ["rare"]


def test_f108_balanced_classes_are_quiet(build, run_data):
    root = build.imagefolder(splits=("train",), per_class=3)
    build.image("train/cat/extra.jpg")  # 4 vs 3 is no imbalance
    assert "F108" not in run_data(root).codes()


def test_f109_exact_duplicates_within_a_split(build, run_data):
    root = build.imagefolder()
    source = root / "train" / "cat" / "001.jpg"
    (root / "train" / "cat" / "001 (1).jpg").write_bytes(source.read_bytes())
    (root / "train" / "dog" / "same.jpg").write_bytes(source.read_bytes())
    result = run_data(root)
    result.snapshot("F109")
    finding = result.one("F109")
    assert {os.path.basename(p) for p in finding["evidence"]["files"]} == {"001.jpg", "001 (1).jpg", "same.jpg"}
    assert len(finding["evidence"]["cross_class_groups"]) == 1


def test_f110_exact_and_near_duplicates_across_splits(build, run_data):
    root = build.imagefolder(size=(96, 80))
    original = root / "train" / "owl" / "002.jpg"
    (root / "val" / "owl" / "copy.jpg").write_bytes(original.read_bytes())
    Image.open(root / "train" / "cat" / "003.jpg").resize((72, 60)).save(root / "val" / "cat" / "resized.png")
    result = run_data(root)
    result.snapshot("F110")
    finding = result.one("F110")
    assert finding["severity"] == "error"
    pairs = {(os.path.basename(p["file"]), os.path.basename(p["duplicate_of"])) for p in finding["evidence"]["pairs"]}
    assert pairs == {("copy.jpg", "002.jpg"), ("resized.png", "003.jpg")}
    assert finding["evidence"]["exact_pairs"] == 1 and finding["evidence"]["near_pairs"] == 1


def test_f110_not_reported_when_ignored(build, run_data):
    root = build.imagefolder()
    (root / "val" / "owl" / "copy.jpg").write_bytes((root / "train" / "owl" / "001.jpg").read_bytes())
    result = run_data(root, "--ignore", "F110")
    assert "F110" not in result.codes() and result.rc == 0


def test_f111_exif_orientation(build, run_data):
    root = build.imagefolder()
    exif = Image.Exif()
    exif[0x0112] = 6
    photo(500).save(root / "train" / "dog" / "phone.jpg", exif=exif.tobytes())
    result = run_data(root)
    result.snapshot("F111")
    finding = result.one("F111")
    assert [os.path.basename(p) for p in finding["evidence"]["files"]] == ["phone.jpg"]
    assert "orientation 6" in finding["message"]


def test_f112_degenerate_images(build, run_data):
    root = build.imagefolder()
    build.image("train/cat/tiny.png", fmt="PNG", width=6, height=6)
    build.image("train/dog/strip.jpg", width=400, height=24)
    Image.new("RGB", (64, 64), (0, 0, 0)).save(root / "train" / "owl" / "black.jpg")
    result = run_data(root)
    assert result.files("F112") == {"tiny.png", "strip.jpg", "black.jpg"}
    reasons = " ".join(result.one("F112")["evidence"]["reasons"].values())
    assert "tiny" in reasons and "aspect" in reasons and "blank" in reasons
    result.snapshot("F112")


def test_f113_statistics_match_known_pixels(build, run_data, tmp_path):
    root = tmp_path / "halves"
    for cls in ("a", "b"):
        for k in range(2):
            image = Image.new("RGB", (64, 64), (0, 0, 255))
            image.paste((255, 0, 0), (0, 0, 32, 64))
            (root / cls).mkdir(parents=True, exist_ok=True)
            image.rotate(90 * k).save(root / cls / f"{k}.png")
    result = run_data(root, "--ignore", "F109")
    result.snapshot("F113")
    finding = result.one("F113")
    assert finding["evidence"]["mean"] == [0.5, 0.0, 0.5]
    assert finding["evidence"]["std"] == [0.5, 0.0, 0.5]
    assert finding["evidence"]["mean_255"] == [127.5, 0.0, 127.5]
    assert "transforms.Normalize(mean=[0.5, 0.0, 0.5], std=[0.5, 0.0, 0.5])" in finding["fix"]


@pytest.mark.parametrize("layout", ["flat", "explicit_splits"])
def test_other_layouts(build, run_data, layout):
    if layout == "flat":
        for k in range(3):
            build.image(f"flat/{k}.jpg")
        build.image("flat/gray.jpg", mode="L")
        result = run_data(build.root / "flat")
        assert result.files("F102") == {"gray.jpg"}
    else:
        build.imagefolder(splits=("a_train", "b_holdout"))
        (build.root / "b_holdout" / "cat" / "leak.jpg").write_bytes((build.root / "a_train" / "cat" / "000.jpg").read_bytes())
        result = run_data(build.root / "a_train", build.root / "b_holdout")
        assert result.report["extra"]["splits"] == ["a_train", "b_holdout"]
        assert result.files("F110") == {"leak.jpg"}


def test_f112_image_tiny_for_its_dataset(build, run_data):
    root = build.imagefolder(size=(128, 128))
    build.image("train/dog/icon.jpg", width=12, height=12)  # above the absolute 10 px, 10x below the rest
    build.image("train/owl/half.jpg", width=64, height=64)  # smaller, but within 4x: a normal photo
    result = run_data(root)
    result.snapshot("F112")
    finding = result.one("F112")
    assert [os.path.basename(p) for p in finding["evidence"]["files"]] == ["icon.jpg"]
    assert "12x12 px, shorter side 12 px against a median of 128 px" in finding["message"]


def test_f112_relative_size_needs_enough_images(build, run_data):
    root = build.imagefolder(splits=("train",), classes=("cat", "dog"), per_class=2, size=(128, 128))
    build.image("train/dog/icon.jpg", width=12, height=12)
    assert run_data(root).files("F112") == set()  # 5 images: no median to judge against
