"""TFRecord checks F201–F203 on hand-written records, and the CRC32C they rely on."""

from __future__ import annotations

import gzip
import struct

from conftest import crc32c_bitwise, example, frame, jpeg_bytes, write_tfrecord

from nndoctor.commands.data.crc32c import crc32c, crc32c_python, masked_crc32c
from nndoctor.commands.data.tfrecord import parse_example


def good_records(n: int, start: int = 0) -> list[bytes]:
    return [
        example({"image/encoded": jpeg_bytes(start + i), "label": [start + i], "bbox": [0.1, 0.2, 0.5, 0.6]})
        for i in range(n)
    ]


def test_crc32c_check_value_and_implementations_agree():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C standard check value
    for data in (b"", b"a", bytes(range(256)) * 3):
        assert crc32c(data) == crc32c_python(data) == crc32c_bitwise(data)
    # TF's mask: rotate right by 15 and add 0xa282ead8.
    raw = crc32c(b"abc")
    assert masked_crc32c(b"abc") == (((raw >> 15) | (raw << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_parse_example_reads_types_and_lengths():
    features = parse_example(example({"a": [b"x", b"y"], "b": [1.0, 2.0, 3.0], "c": [1, -2]}))
    assert {k: (t, n) for k, (t, n, _) in features.items()} == {"a": ("bytes", 2), "b": ("float", 3), "c": ("int64", 2)}


def test_clean_tfrecords_plain_and_gzip(tmp_path, run_data):
    write_tfrecord(tmp_path / "train-00000-of-00002.tfrecord", good_records(5))
    write_tfrecord(tmp_path / "train-00001-of-00002.tfrecord.gz", good_records(5, 5), compress=True)
    result = run_data(str(tmp_path / "train-*"))
    assert result.rc == 0 and result.findings == []
    assert result.report["extra"]["scan"]["tfrecord_records"] == 10


def test_f201_data_crc_length_crc_and_truncation(tmp_path, run_data):
    records = [frame(r) for r in good_records(4)]
    flipped = bytearray(records[1])
    flipped[20] ^= 0x01  # a payload byte: data CRC no longer matches
    (tmp_path / "data_crc.tfrecord").write_bytes(records[0] + bytes(flipped) + records[2])
    bad_length = bytearray(records[0])
    bad_length[0] ^= 0x01  # the length: its CRC no longer matches
    (tmp_path / "length_crc.tfrecord").write_bytes(bytes(bad_length) + records[1])
    whole = b"".join(records)
    (tmp_path / "cut.tfrecord").write_bytes(whole[: len(whole) - 30])
    (tmp_path / "cut.tfrecord.gz").write_bytes(gzip.compress(whole)[:-40])
    write_tfrecord(tmp_path / "fine.tfrecord", good_records(2))
    result = run_data(tmp_path)
    finding = result.one("F201")
    assert result.files("F201") == {"data_crc.tfrecord", "length_crc.tfrecord", "cut.tfrecord", "cut.tfrecord.gz"}
    text = " ".join(finding["evidence"]["records"])
    assert "data_crc.tfrecord#1" in text and "data CRC mismatch" in text
    assert "length CRC mismatch" in text and "truncated" in text and "compressed stream" in text
    assert result.rc == 1
    result.snapshot("F201")


def test_f202_types_missing_keys_lengths_and_garbage(tmp_path, run_data):
    records = good_records(20)
    records[3] = example({"image/encoded": jpeg_bytes(3), "label": [0.5], "bbox": [0.1, 0.2, 0.5, 0.6]})
    records[7] = example({"image/encoded": jpeg_bytes(7), "bbox": [0.1, 0.2, 0.5, 0.6]})
    records[11] = example({"image/encoded": jpeg_bytes(11), "label": [1], "bbox": [0.1, 0.2, 0.5, 0.6, 0.7]})
    records[15] = b"\xff\xff\xff"  # framed correctly, but no protobuf
    write_tfrecord(tmp_path / "mixed.tfrecord", records)
    result = run_data(tmp_path / "mixed.tfrecord")
    result.snapshot("F202")
    finding = result.one("F202")
    text = "\n".join(finding["evidence"]["records"])
    assert "mixed.tfrecord#3: 'label' is float, elsewhere int64" in text
    assert "mixed.tfrecord#7: 'label' missing" in text
    assert "mixed.tfrecord#11: 'bbox' has 5 values" in text
    assert "mixed.tfrecord#15: not a tf.train.Example" in text
    assert not any("#0:" in line for line in finding["evidence"]["records"])


def test_f202_variable_length_features_are_not_flagged(tmp_path, run_data):
    records = [example({"label": [1], "boxes": [0.5] * (4 * (1 + i % 3))}) for i in range(12)]
    write_tfrecord(tmp_path / "var.tfrecord", records)
    assert "F202" not in run_data(tmp_path / "var.tfrecord").codes()


def test_f203_undecodable_images_in_records(tmp_path, run_data):
    records = good_records(4)
    cut = jpeg_bytes(9)
    records[2] = example({"image/encoded": cut[: len(cut) // 2], "label": [2], "bbox": [0.1, 0.2, 0.5, 0.6]})
    records[3] = example({"image/encoded": b"raw pixels " * 10, "label": [3], "bbox": [0.1, 0.2, 0.5, 0.6]})
    write_tfrecord(tmp_path / "imgs.tfrecord", records)
    result = run_data(tmp_path / "imgs.tfrecord")
    text = "\n".join(result.one("F203")["evidence"]["records"])
    assert "imgs.tfrecord#2: 'image/encoded'" in text and "imgs.tfrecord#3: 'image/encoded': not an encoded image" in text
    assert "#0" not in text and "#1" not in text
    result.snapshot("F203")


def test_tfrecord_frame_helper_matches_length_layout():
    framed = frame(b"abc")
    assert struct.unpack("<Q", framed[:8])[0] == 3 and len(framed) == 8 + 4 + 3 + 4
