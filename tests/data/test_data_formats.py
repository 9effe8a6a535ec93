"""Record formats (HDF5, NumPy, WebDataset, Parquet, LMDB): the folder findings, at the record,
and format detection from content (an unknown format is a usage error, never another format's
finding). Every dataset is built here with h5py, numpy, tarfile, pyarrow, lmdb and Pillow."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import tarfile
import zipfile

import numpy as np
import pytest
from conftest import photo

from nndoctor.commands.data.sources import expand_braces, split_name

h5py = pytest.importorskip("h5py")


def pixels(seed: int, size: int = 32) -> np.ndarray:
    return np.asarray(photo(seed, size, size))


def encoded(seed: int, fmt: str = "JPEG", mode: str = "RGB", size: int = 32) -> bytes:
    buffer = io.BytesIO()
    photo(seed, size, size, mode=mode).save(buffer, fmt)
    return buffer.getvalue()


def truncated_jpeg(seed: int) -> bytes:
    data = encoded(seed)
    return data[: len(data) // 2]


# -- detection -----------------------------------------------------------------------------
def test_unknown_binary_is_an_unsupported_format_not_a_tfrecord(tmp_path, run_data):
    blob = tmp_path / "train.bin"
    blob.write_bytes(np.random.default_rng(0).bytes(4096))
    result = run_data(blob)
    assert result.rc == 2 and result.report == {}
    assert "train.bin: unsupported format: unknown binary (supported: image folders" in result.err
    assert "HDF5" in result.err and "F201" not in result.out + result.err


def test_a_zip_that_is_not_npz_is_named_as_what_it_is(tmp_path, run_data):
    with zipfile.ZipFile(tmp_path / "images.zip", "w") as archive:
        archive.writestr("a.jpg", encoded(1))
    result = run_data(tmp_path / "images.zip")
    assert result.rc == 2 and "unsupported format: ZIP archive of 1 image (extract it and give the folder)" in result.err


def test_files_met_beside_datasets_are_named(tmp_path, run_data):
    """What people pass by mistake is named, and never read: a pickle is not unpickled."""
    import sqlite3

    import torch

    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "data_batch_1").write_bytes(pickle.dumps({"data": Exploit()}, protocol=2))  # CIFAR's layout
    torch.save({"w": torch.zeros(2)}, tmp_path / "model.pt")
    sqlite3.connect(tmp_path / "labels.db").execute("create table t(a)").connection.commit()
    (tmp_path / "w.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + b" " * 14)
    expected = {"data_batch_1": "a Python pickle (load it where you trust it and save the arrays with numpy.savez)",
                "model.pt": "a PyTorch checkpoint (torch.save's ZIP: nndoctor ckpt inspect)",
                "labels.db": "SQLite database",
                "w.safetensors": "a safetensors file (model weights: nndoctor ckpt inspect)"}
    for name, what in expected.items():
        result = run_data(tmp_path / name)
        assert result.rc == 2 and f"{name}: unsupported format: {what} (supported: " in result.err, result.err
    assert not marker.exists()


def test_a_glob_sets_unsupported_files_aside_with_a_note(tmp_path, run_data):
    np.save(tmp_path / "images.npy", np.stack([pixels(i) for i in range(4)] + [pixels(1)]))
    (tmp_path / "index.bin").write_bytes(b"\x00\x01\x02" * 100)
    result = run_data(str(tmp_path / "*"))
    assert result.rc == 0 and result.one("F109")["evidence"]["files"] == [f"{tmp_path}/images.npy[1]",
                                                                           f"{tmp_path}/images.npy[4]"]
    assert "note: " in result.err and "index.bin: unsupported format: unknown binary" in result.err
    alone = run_data(str(tmp_path / "*.bin"))
    assert alone.rc == 2 and "index.bin: unsupported format: unknown binary" in alone.err


def test_git_lfs_pointer_is_named(tmp_path, run_data):
    pointer = tmp_path / "mnist.npz"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:cdec22\nsize 444641002\n")
    result = run_data(pointer)
    assert result.rc == 2 and "unsupported format: a Git LFS pointer, not the file's content (run git lfs pull)" in result.err


def test_brace_patterns_and_split_names():
    assert expand_braces("shard-{000000..000002}.tar") == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert expand_braces("{train,val}-{0..1}.tar") == ["train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"]
    assert split_name("data/train-00000-of-00004.parquet") == "train"
    assert split_name("shards/shard-000003.tar") == "shard"
    assert split_name("cifar/train/0000.parquet") == "train"
    assert split_name("db/val_lmdb") == "val"


# -- HDF5 ----------------------------------------------------------------------------------
def test_hdf5_arrays_findings_name_the_dataset_and_index(tmp_path, run_data):
    images = np.stack([pixels(i) for i in range(40)])
    images[9] = images[4]  # exact duplicate
    images[13] = 200  # blank
    labels = np.array([0] * 18 + [1] * 21 + [2] * 1)  # class 2 is under 1/10 of class 1
    path = tmp_path / "train.h5"
    with h5py.File(path, "w") as handle:
        handle["images"] = images
        handle["labels"] = labels
        handle["masks"] = np.zeros((40, 32, 32), np.uint8)  # an image-like array not to be picked
    result = run_data(path)
    assert "F201" not in result.codes()
    assert result.one("F109")["evidence"]["groups"] == [[f"{path}:images[4]", f"{path}:images[9]"]]
    assert result.one("F112")["evidence"]["files"] == [f"{path}:images[13]"]
    imbalance = result.one("F108")
    assert imbalance["evidence"]["counts"] == {"0": 18, "1": 21, "2": 1}
    assert imbalance["evidence"]["under_represented"] == ["2"]
    assert "images from 'images' (40×32×32×3 unsigned integers), labels from 'labels'" in result.err
    result.snapshot("F109")


def test_hdf5_encoded_bytes_and_split_groups(tmp_path, run_data):
    vlen = h5py.vlen_dtype(np.uint8)
    path = tmp_path / "dataset.h5"
    train = [encoded(i) for i in range(12)]
    train[3] = truncated_jpeg(3)
    train[5] = encoded(5, mode="L")
    test = [encoded(100 + i) for i in range(6)]
    test[2] = train[7]  # the same picture in both splits
    with h5py.File(path, "w") as handle:
        for name, items in (("train", train), ("test", test)):
            data = handle.create_dataset(f"{name}/jpegs", (len(items),), dtype=vlen)
            for i, item in enumerate(items):
                data[i] = np.frombuffer(item, np.uint8)
            handle[f"{name}/labels"] = np.arange(len(items)) % 2
    result = run_data(path)
    assert result.one("F101")["evidence"]["files"] == [f"{path}:train/jpegs[3]"]
    assert "truncated JPEG" in result.one("F101")["message"]
    assert result.one("F102")["evidence"]["files"] == [f"{path}:train/jpegs[5]"]
    cross = result.one("F110")["evidence"]["pairs"]
    assert cross[0] == {"file": f"{path}:test/jpegs[2]", "duplicate_of": f"{path}:train/jpegs[7]", "distance": 0}
    assert result.report["extra"]["splits"] == ["test", "train"]
    result.snapshot("F101")


def test_hdf5_images_and_labels_options(tmp_path, run_data):
    path = tmp_path / "mixed.h5"
    with h5py.File(path, "w") as handle:
        handle["a"] = np.stack([pixels(i) for i in range(6)])
        handle["b"] = np.stack([pixels(50 + i) for i in range(6)])
        handle["b"][2] = handle["b"][1]
        handle["y"] = np.arange(6)
    picked = run_data(path, "--images", "b", "--labels", "y")
    assert picked.one("F109")["evidence"]["files"] == [f"{path}:b[1]", f"{path}:b[2]"]
    assert "images from 'b'" in picked.err and "labels from 'y'" in picked.err
    wrong = run_data(path, "--images", "nope")
    assert wrong.rc == 2 and "--images nope: no image array of that name (arrays: a (6×32×32×3" in wrong.err


def test_hdf5_course_layout_class_name_strings_are_not_images(tmp_path, run_data):
    """The layout of the widely used cat/non-cat course files: train_set_x, train_set_y and
    list_classes (byte strings) in train_….h5, the same with test_ in test_….h5."""
    images = np.stack([pixels(i, 24) for i in range(16)])
    for split, rows in (("train", images[:12]), ("test", images[12:].copy())):
        if split == "test":
            rows[1] = images[5]
        with h5py.File(tmp_path / f"{split}_catvnoncat.h5", "w") as handle:
            handle[f"{split}_set_x"] = rows
            handle[f"{split}_set_y"] = np.arange(len(rows)) % 2
            handle["list_classes"] = np.array([b"non-cat", b"cat"], dtype="S7")
    result = run_data(tmp_path / "train_catvnoncat.h5", tmp_path / "test_catvnoncat.h5")
    assert "F101" not in result.codes()
    assert result.one("F110")["evidence"]["pairs"][0]["duplicate_of"] == f"{tmp_path}/train_catvnoncat.h5:train_set_x[5]"
    assert "images from 'train_set_x' (12×24×24×3 unsigned integers), labels from 'train_set_y'" in result.err
    assert sorted(result.report["extra"]["splits"]) == ["test", "train"]


def test_hdf5_array_of_giant_images_is_not_read(tmp_path, run_data):
    path = tmp_path / "huge.h5"
    with h5py.File(path, "w") as handle:  # chunks never written: a small file declaring 100 Mpx images
        handle.create_dataset("images", shape=(2, 10000, 10000), dtype=np.uint8, chunks=(1, 1000, 1000))
    result = run_data(path)
    finding = result.one("F101")
    assert finding["evidence"]["files"] == [f"{path}:images[0]", f"{path}:images[1]"]
    assert "decompression bomb: 10000x10000 = 100 Mpx per image" in finding["message"]
    with h5py.File(tmp_path / "bomb.h5", "w") as handle:  # 40 GB declared in a few kB
        handle.create_dataset("images", shape=(100, 20000, 20000), dtype=np.uint8, chunks=(1, 1000, 1000))
    bomb = run_data(tmp_path / "bomb.h5")
    assert bomb.rc == 2 and "'images' declares 38,147.0 MB of pixels in a file of" in bomb.err


def test_clean_hdf5_is_silent(tmp_path, run_data):
    path = tmp_path / "train.h5"
    with h5py.File(path, "w") as handle:
        handle["x"] = np.stack([pixels(i) for i in range(12)]).astype(np.float32) / 255
        handle["y"] = np.arange(12) % 3
    result = run_data(path)
    assert result.rc == 0 and result.serious() == [] and result.codes() == {"F113"}


# -- NumPy ---------------------------------------------------------------------------------
def test_npy_ranges_and_truncation(tmp_path, run_data):
    images = np.stack([pixels(i) for i in range(300)])  # two units of records
    images[290] = images[10]
    path = tmp_path / "images.npy"
    np.save(path, images)
    result = run_data(path)
    assert result.one("F109")["evidence"]["files"] == [f"{path}[10]", f"{path}[290]"]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 32 * 32 * 3 * 2 - 100])  # the last items cut off
    cut = run_data(path)
    assert cut.one("F101")["evidence"]["files"] == [f"{path}[297]", f"{path}[298]", f"{path}[299]"]
    assert "truncated file" in cut.one("F101")["message"]


def test_npz_keras_layout_splits_and_cross_split_duplicates(tmp_path, run_data):
    x_train = np.stack([pixels(i, 28)[..., 0] for i in range(30)])  # grayscale, like mnist.npz
    x_test = np.stack([pixels(100 + i, 28)[..., 0] for i in range(10)])
    x_test[4] = x_train[17]
    path = tmp_path / "mnist.npz"
    np.savez(path, x_train=x_train, y_train=np.arange(30) % 3, x_test=x_test, y_test=np.arange(10) % 3)
    result = run_data(path)
    pair = result.one("F110")["evidence"]["pairs"][0]
    assert pair == {"file": f"{path}:x_test[4]", "duplicate_of": f"{path}:x_train[17]", "distance": 0}
    assert sorted(result.report["extra"]["splits"]) == ["test", "train"]
    assert "F102" not in result.codes()  # every image is grayscale: no mixture


# -- WebDataset ----------------------------------------------------------------------------
def write_shard(path, samples: list[tuple[str, dict[str, bytes]]]) -> None:
    with tarfile.open(path, "w") as archive:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))


def test_webdataset_shards_with_brace_pattern(tmp_path, run_data):
    for shard in range(3):
        samples = [(f"s{shard}{i:03d}", {"jpg": encoded(shard * 100 + i), "cls": str(i % 2).encode()})
                   for i in range(8)]
        if shard == 1:
            samples[3][1]["jpg"] = truncated_jpeg(7)
            samples[5] = (samples[5][0], {"jpg": encoded(55, "PNG"), "json": json.dumps({"label": 1}).encode()})
        if shard == 2:
            samples[6][1]["jpg"] = encoded(2)  # same bytes as shard 0's sample 2
        write_shard(tmp_path / f"shard-{shard:06d}.tar", samples)
    result = run_data(str(tmp_path / "shard-{000000..000002}.tar"))
    assert result.one("F101")["evidence"]["files"] == [f"{tmp_path}/shard-000001.tar:s1003.jpg"]
    assert result.one("F104")["evidence"]["reasons"] == {f"{tmp_path}/shard-000001.tar:s1005.jpg": "PNG content named .jpg"}
    assert result.one("F109")["evidence"]["groups"] == [
        [f"{tmp_path}/shard-000000.tar:s0002.jpg", f"{tmp_path}/shard-000002.tar:s2006.jpg"]]
    assert result.report["extra"]["scan"]["records"] == 24
    result.snapshot("F104")


def test_empty_shard_among_good_ones_is_unreadable_not_unsupported(tmp_path, run_data):
    write_shard(tmp_path / "s-0000.tar", [(f"{i:03d}", {"jpg": encoded(i), "cls": b"0"}) for i in range(3)])
    (tmp_path / "s-0001.tar").write_bytes(b"")
    result = run_data(tmp_path / "s-0000.tar", tmp_path / "s-0001.tar")
    assert result.one("F101")["evidence"]["files"] == [f"{tmp_path}/s-0001.tar"]
    assert result.report["extra"]["scan"]["images_decoded"] == 3


def test_truncated_shard_names_the_member_where_it_breaks(tmp_path, run_data):
    path = tmp_path / "train-000000.tar"
    write_shard(path, [(f"{i:04d}", {"jpg": encoded(i), "cls": b"0"}) for i in range(6)])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    result = run_data(path)
    finding = result.one("F101")
    assert len(finding["evidence"]["files"]) == 1
    assert finding["evidence"]["files"][0].startswith(f"{path}:00")
    assert "truncated or corrupt tar shard" in finding["message"]
    assert result.report["extra"]["scan"]["images_decoded"] >= 2


# -- Parquet (Hugging Face datasets layout) ------------------------------------------------
def write_parquet(path, images: list[bytes | None], labels: list[int], names: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({
        "image": pa.array([None if b is None else {"bytes": b, "path": f"{i}.jpg"} for i, b in enumerate(images)],
                          type=image_type),
        "label": pa.array(labels, type=pa.int64()),
    })
    features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": names}}
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, path, row_group_size=8)


def test_parquet_image_structs_with_class_labels(tmp_path, run_data):
    pytest.importorskip("pyarrow")
    folder = tmp_path / "data"
    folder.mkdir()
    train = [encoded(i) for i in range(20)]
    train[2] = b"<html>404</html>"
    train[11] = encoded(11, mode="L")
    test = [encoded(200 + i) for i in range(6)]
    test[5] = train[14]
    write_parquet(folder / "train-00000-of-00001.parquet", train, [i % 2 for i in range(20)], ["cat", "dog"])
    write_parquet(folder / "test-00000-of-00001.parquet", test, [i % 2 for i in range(6)], ["cat", "dog"])
    (tmp_path / "README.md").write_text("# a dataset card\n")
    result = run_data(tmp_path)
    train_file = f"{folder}/train-00000-of-00001.parquet"
    assert result.one("F101")["evidence"]["reasons"] == {f"{train_file}:image[2]": "not an image: the content is HTML/XML"}
    assert result.one("F102")["evidence"]["files"] == [f"{train_file}:image[11]"]
    pair = result.one("F110")["evidence"]["pairs"][0]
    assert pair["file"] == f"{folder}/test-00000-of-00001.parquet:image[5]" and pair["duplicate_of"] == f"{train_file}:image[14]"
    assert "F108" not in result.codes() and "F105" not in result.codes()
    assert sorted(result.report["extra"]["splits"]) == ["test", "train"]
    result.snapshot("F110")


def test_hugging_face_save_to_disk_arrow_folders(tmp_path, run_data):
    import pyarrow as pa

    def write_arrow(path, images, labels):
        image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        table = pa.table({"image": pa.array([{"bytes": b, "path": None} for b in images], type=image_type),
                          "label": pa.array(labels, type=pa.int64())})
        features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": ["ant", "bee"]}}
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
        path.parent.mkdir(parents=True, exist_ok=True)
        with pa.ipc.new_stream(path, table.schema) as writer:  # what datasets' ArrowWriter writes
            for batch in table.to_batches(max_chunksize=5):
                writer.write_batch(batch)

    train = [encoded(i) for i in range(12)]
    train[7] = truncated_jpeg(7)
    test = [encoded(50 + i) for i in range(4)]
    test[3] = train[2]
    write_arrow(tmp_path / "ds" / "train" / "data-00000-of-00001.arrow", train, [i % 2 for i in range(12)])
    write_arrow(tmp_path / "ds" / "train" / "cache-5f2a.arrow", train, [0] * 12)  # a map() result: skipped
    write_arrow(tmp_path / "ds" / "test" / "data-00000-of-00001.arrow", test, [0, 1, 0, 1])
    (tmp_path / "ds" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    result = run_data(tmp_path / "ds")
    train_file = f"{tmp_path}/ds/train/data-00000-of-00001.arrow"
    assert result.one("F101")["evidence"]["files"] == [f"{train_file}:image[7]"]
    assert result.one("F110")["evidence"]["pairs"][0] == {
        "file": f"{tmp_path}/ds/test/data-00000-of-00001.arrow:image[3]", "duplicate_of": f"{train_file}:image[2]",
        "distance": 0}
    assert "F109" not in result.codes()  # the cache file was not read
    assert result.report["extra"]["scan"]["records"] == 16


# -- LMDB ----------------------------------------------------------------------------------
lmdb = pytest.importorskip("lmdb")


def write_lmdb(folder, items: dict[bytes, bytes]) -> None:
    env = lmdb.open(str(folder), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for key, value in items.items():
            txn.put(key, value)
    env.close()


def test_lmdb_encoded_images_per_key_is_not_f105(tmp_path, run_data):
    items = {f"{i:08d}".encode(): encoded(i) for i in range(10)}
    items[b"00000004"] = truncated_jpeg(4)
    items[b"00000008"] = items[b"00000001"]
    items[b"__len__"] = b"10"
    write_lmdb(tmp_path / "train_lmdb", items)
    result = run_data(tmp_path / "train_lmdb")
    assert "F105" not in result.codes()
    assert result.one("F101")["evidence"]["files"] == [f"{tmp_path}/train_lmdb:00000004"]
    assert result.one("F109")["evidence"]["files"] == [f"{tmp_path}/train_lmdb:00000001", f"{tmp_path}/train_lmdb:00000008"]


def test_lmdb_pickled_records_are_read_without_running_code(tmp_path, run_data):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    items = {f"{i:05d}".encode(): pickle.dumps((encoded(i, mode="L" if i == 6 else "RGB"), i % 3)) for i in range(12)}
    items[b"00003"] = pickle.dumps((Exploit(), 1))
    items[b"00007"] = pickle.dumps({"image": pixels(7), "label": 2})  # a numpy array: allowlisted
    write_lmdb(tmp_path / "db", items)
    result = run_data(tmp_path / "db")
    assert not marker.exists()
    assert result.one("F101")["evidence"]["files"] == [f"{tmp_path}/db:00003"]
    assert result.one("F102")["evidence"]["files"] == [f"{tmp_path}/db:00006"]
    assert result.report["extra"]["scan"]["images_decoded"] == 11


def test_gzipped_shard_is_read_and_a_shard_without_images_is_nothing_to_check(tmp_path, run_data):
    plain = tmp_path / "plain.tar"
    write_shard(plain, [(f"{i:03d}", {"png": encoded(i, "PNG"), "cls": b"0"}) for i in range(4)]
                + [("004", {"png": truncated_jpeg(4), "cls": b"0"})])
    shard = tmp_path / "train-0000.tar.gz"
    shard.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    result = run_data(shard)
    assert result.one("F101")["evidence"]["files"] == [f"{shard}:004.png"]
    assert result.report["extra"]["scan"]["images_decoded"] == 4
    texts = tmp_path / "captions.tar"
    write_shard(texts, [(f"{i:03d}", {"txt": b"a caption"}) for i in range(3)])
    empty = run_data(texts)
    assert empty.rc == 2 and "the files hold no image records" in empty.err


def datum(channels: int, height: int, width: int, data: bytes, label: int, encoded_flag: bool = False) -> bytes:
    """A Caffe Datum message (channels=1, height=2, width=3, data=4, label=5, encoded=7)."""
    from conftest import _field, _varint

    message = (_varint(1 << 3) + _varint(channels) + _varint(2 << 3) + _varint(height)
               + _varint(3 << 3) + _varint(width) + _field(4, data) + _varint(5 << 3) + _varint(label))
    return message + (_varint(7 << 3) + _varint(1) if encoded_flag else b"")


def test_lmdb_caffe_datum_raw_and_encoded(tmp_path, run_data):
    items = {}
    for i in range(8):
        chw = np.ascontiguousarray(np.moveaxis(pixels(i), -1, 0))
        items[f"{i:08d}".encode()] = datum(3, 32, 32, chw.tobytes(), i % 2)
    items[b"00000003"] = datum(3, 32, 32, b"\x00" * 100, 1)  # the pixels do not fill 3x32x32
    items[b"00000005"] = items[b"00000001"]
    items[b"00000009"] = datum(0, 0, 0, encoded(9), 0, encoded_flag=True)
    write_lmdb(tmp_path / "caffe_train_lmdb", items)
    result = run_data(tmp_path / "caffe_train_lmdb")
    assert result.one("F101")["evidence"]["reasons"] == {
        f"{tmp_path}/caffe_train_lmdb:00000003": "Caffe Datum of 3x32x32 holds 100 bytes"}
    assert result.one("F109")["evidence"]["files"] == [f"{tmp_path}/caffe_train_lmdb:00000001",
                                                       f"{tmp_path}/caffe_train_lmdb:00000005"]
    assert result.report["extra"]["scan"]["images_decoded"] == 8
    assert result.report["extra"]["splits"] == ["train"]


def test_shards_written_by_webdataset_itself(tmp_path, run_data):
    webdataset = pytest.importorskip("webdataset")

    for shard in range(2):
        with webdataset.TarWriter(str(tmp_path / f"pets-{shard:04d}.tar")) as sink:
            for i in range(5):
                image = photo(shard * 10 + i, 40, 40, mode="L" if (shard, i) == (1, 3) else "RGB")
                sink.write({"__key__": f"sample{shard}{i:03d}", "jpg": image, "cls": i % 2})
    result = run_data(str(tmp_path / "pets-{0000..0001}.tar"))
    assert result.one("F102")["evidence"]["files"] == [f"{tmp_path}/pets-0001.tar:sample1003.jpg"]
    assert result.report["extra"]["scan"]["records"] == 10


def test_crop_and_tiny_images_in_records(tmp_path, run_data):
    items = {f"{i:04d}".encode(): pickle.dumps((encoded(i, size=48), i % 2)) for i in range(10)}
    items[b"0002"] = pickle.dumps((encoded(2, size=24), 0))  # smaller than the crop
    items[b"0006"] = pickle.dumps((encoded(6, size=8), 0))  # tiny
    write_lmdb(tmp_path / "train_lmdb", items)
    result = run_data(tmp_path / "train_lmdb", "--crop", "32")
    assert result.one("F103")["evidence"]["reasons"] == {f"{tmp_path}/train_lmdb:0002": "24x24",
                                                        f"{tmp_path}/train_lmdb:0006": "8x8"}
    assert result.one("F112")["evidence"]["reasons"] == {f"{tmp_path}/train_lmdb:0006": "tiny: 8x8 px"}


def test_class_balance_from_record_labels(tmp_path, run_data):
    """F108 from the labels each record format carries: .cls / a "label" in .json members,
    a Parquet label column, pickled (bytes, label) LMDB values."""
    labels = [0] * 15 + [1] * 14 + [2]
    samples = []
    for i, label in enumerate(labels):
        meta = {"json": json.dumps({"label": label}).encode()} if i % 3 == 0 else {"cls": str(label).encode()}
        samples.append((f"k{i:04d}", {"jpg": encoded(500 + i), **meta}))
    write_shard(tmp_path / "train-000000.tar", samples)
    write_parquet(tmp_path / "train.parquet", [encoded(600 + i) for i in range(30)], labels, ["a", "b", "c"])
    write_lmdb(tmp_path / "train_lmdb", {f"{i:04d}".encode(): pickle.dumps((encoded(700 + i), label))
                                         for i, label in enumerate(labels)})
    for name, rare in (("train-000000.tar", "2"), ("train.parquet", "c"), ("train_lmdb", "2")):
        finding = run_data(tmp_path / name).one("F108")
        assert finding["evidence"]["under_represented"] == [rare], name
        assert sorted(finding["evidence"]["counts"].values()) == [1, 14, 15], name


def test_same_images_give_the_same_findings_in_every_format(tmp_path, run_data):
    """One set of images (PNG: lossless) as an image folder, an HDF5 array, a WebDataset shard,
    a Parquet file and an .npz: the same findings, each at its own record name."""
    rng = np.random.default_rng(3)
    images = [(rng.random((24, 24, 3)) * 255).astype(np.uint8) for _ in range(24)]
    images[5] = images[1]  # F109
    images[9] = np.full((24, 24, 3), 128, np.uint8)  # F112: blank
    labels = [2 if i == 23 else i % 2 for i in range(24)]  # F108: class 2 has one image

    def png(array: np.ndarray) -> bytes:
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, "PNG")
        return buffer.getvalue()

    for i, (array, label) in enumerate(zip(images, labels)):
        (tmp_path / "folder" / "train" / str(label)).mkdir(parents=True, exist_ok=True)
        (tmp_path / "folder" / "train" / str(label) / f"{i:03d}.png").write_bytes(png(array))
    with h5py.File(tmp_path / "train.h5", "w") as handle:
        handle["images"], handle["labels"] = np.stack(images), np.array(labels)
    write_shard(tmp_path / "train-0000.tar", [(f"{i:03d}", {"png": png(a), "cls": str(label).encode()})
                                              for i, (a, label) in enumerate(zip(images, labels))])
    write_parquet(tmp_path / "train.parquet", [png(a) for a in images], labels, ["0", "1", "2"])
    np.savez(tmp_path / "data.npz", x_train=np.stack(images), y_train=np.array(labels))
    names = {"folder": lambda i: f"{tmp_path}/folder/train/{labels[i]}/{i:03d}.png",
             "train.h5": lambda i: f"{tmp_path}/train.h5:images[{i}]",
             "train-0000.tar": lambda i: f"{tmp_path}/train-0000.tar:{i:03d}.png",
             "train.parquet": lambda i: f"{tmp_path}/train.parquet:image[{i}]",
             "data.npz": lambda i: f"{tmp_path}/data.npz:x_train[{i}]"}
    statistics = set()
    for target, name in names.items():
        result = run_data(tmp_path / target, "--no-cache")
        assert result.codes() == {"F108", "F109", "F112", "F113"}, target
        assert result.one("F109")["evidence"]["files"] == [name(1), name(5)], target
        assert result.one("F112")["evidence"]["files"] == [name(9)], target
        assert sorted(result.one("F108")["evidence"]["counts"].values()) == [1, 11, 12], target
        statistics.add((tuple(result.one("F113")["evidence"]["mean"]), tuple(result.one("F113")["evidence"]["std"])))
    assert len(statistics) == 1  # the same per-channel mean and std from every format


def test_webdataset_masks_beside_the_images_are_not_checked_as_images(tmp_path, run_data):
    """Segmentation shards (key.jpg + key.seg.png): the mask is not the training image; taken as
    one, the masks were a grayscale majority, blank and duplicated (three false alarms)."""
    from PIL import Image

    mask = io.BytesIO()
    Image.fromarray((np.arange(32 * 32).reshape(32, 32) % 3).astype(np.uint8), "L").save(mask, "PNG")
    samples = [(f"s{i:04d}", {"jpg": encoded(800 + i), "seg.png": mask.getvalue(), "cls": b"0"}) for i in range(12)]
    samples[4][1]["jpg"] = truncated_jpeg(4)
    write_shard(tmp_path / "seg-000000.tar", samples)
    result = run_data(tmp_path / "seg-000000.tar")
    assert result.codes() == {"F101", "F113"}
    assert result.one("F101")["evidence"]["files"] == [f"{tmp_path}/seg-000000.tar:s0004.jpg"]
    assert result.report["extra"]["scan"]["records"] == 12


def test_grayscale_datasets_get_one_channel_of_statistics(tmp_path, run_data):
    """mnist.npz-style arrays and a folder of grayscale PNGs: Normalize takes one mean and std."""
    gray = np.stack([pixels(i, 28)[..., 0] for i in range(10)])
    np.savez(tmp_path / "mnist.npz", x_train=gray, y_train=np.arange(10) % 2)
    for i, image in enumerate(gray):
        (tmp_path / "digits" / str(i % 2)).mkdir(parents=True, exist_ok=True)
        from PIL import Image

        Image.fromarray(image, "L").save(tmp_path / "digits" / str(i % 2) / f"{i}.png")
    expected_mean = [round(float(gray.mean()) / 255, 4)]
    for target in ("mnist.npz", "digits"):
        finding = run_data(tmp_path / target).one("F113")
        assert finding["evidence"]["mean"] == expected_mean, target
        assert len(finding["evidence"]["std"]) == 1
        assert finding["message"].startswith("single-channel statistics of 10 grayscale images")


def test_parquet_label_column_found_by_its_class_label_feature(tmp_path, run_data):
    """CIFAR-100 on the Hugging Face Hub: columns img, fine_label, coarse_label (ClassLabel features)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    fine = [0] * 12 + [1] * 11 + [2]
    table = pa.table({"img": pa.array([{"bytes": encoded(i), "path": None} for i in range(24)], type=image_type),
                      "fine_label": pa.array(fine, type=pa.int64()),
                      "coarse_label": pa.array([0] * 24, type=pa.int64())})
    features = {"img": {"_type": "Image"},
                "fine_label": {"_type": "ClassLabel", "names": ["apple", "aquarium_fish", "baby"]},
                "coarse_label": {"_type": "ClassLabel", "names": ["fruit"]}}
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, tmp_path / "train-00000-of-00001.parquet")
    result = run_data(tmp_path / "train-00000-of-00001.parquet")
    assert "images from column 'img', labels from column 'fine_label'" in result.err
    assert result.one("F108")["evidence"]["under_represented"] == ["baby"]


def test_a_real_webdataset_shard_gives_no_false_alarm(run_data):
    """webdataset's own test shard (tests/data/fixtures/README.md): 90 grayscale digits with
    .cls labels. Nothing wrong with it: only F113, one channel, equal to the pixels' mean."""
    from pathlib import Path

    from PIL import Image

    shard = Path(__file__).parent / "fixtures" / "webdataset_sample.tgz"
    means = []
    with tarfile.open(shard) as archive:
        for member in archive:
            if member.name.endswith(".png"):
                means.append(np.asarray(Image.open(archive.extractfile(member)).convert("L")).mean() / 255)
    assert len(means) == 90
    result = run_data(shard, "--no-cache")
    assert result.rc == 0 and result.codes() == {"F113"}
    assert result.one("F113")["evidence"]["mean"] == [round(float(np.mean(means)), 4)]
    assert result.report["extra"]["scan"]["records"] == 90


def test_npy_files_pair_images_with_labels(tmp_path, run_data):
    """The X_train.npy / y_train.npy / X_test.npy / y_test.npy layout: labels from the paired file
    (F108), splits from the names (F110), a stray label file set aside with a note."""
    x_train = np.stack([pixels(i) for i in range(30)])
    x_train[7] = x_train[3]
    x_test = np.stack([pixels(100 + i) for i in range(10)])
    x_test[1] = x_train[4]
    np.save(tmp_path / "X_train.npy", x_train)
    np.save(tmp_path / "y_train.npy", np.array([0] * 15 + [1] * 14 + [2]))
    np.save(tmp_path / "X_test.npy", x_test)
    np.save(tmp_path / "y_test.npy", np.arange(10) % 3)
    np.save(tmp_path / "y_val.npy", np.arange(5))
    result = run_data(tmp_path)
    assert result.rc == 1  # F110 is an error
    assert result.one("F109")["evidence"]["files"] == [f"{tmp_path}/X_train.npy[3]", f"{tmp_path}/X_train.npy[7]"]
    assert result.one("F110")["evidence"]["pairs"][0] == {
        "file": f"{tmp_path}/X_test.npy[1]", "duplicate_of": f"{tmp_path}/X_train.npy[4]", "distance": 0}
    assert result.one("F108")["evidence"]["counts"] == {"0": 15, "1": 14, "2": 1}
    assert f"{tmp_path}/X_train.npy: images 30×32×32×3 unsigned integers, labels from y_train.npy" in result.err
    assert f"{tmp_path}/y_val.npy: 5 integers paired with no image array: not read" in result.err
    assert sorted(result.report["extra"]["splits"]) == ["test", "train"]


def test_parquet_cells_that_refer_to_image_files(tmp_path, run_data):
    """{bytes: None, path} cells (datasets opens the file when the row is read): the files are
    checked, an absolute path to no file is F101 at its row, an unresolvable relative one skipped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "images").mkdir()
    for i in range(8):
        (tmp_path / "images" / f"{i}.jpg").write_bytes(encoded(i) if i != 5 else encoded(1))
    cells = [{"bytes": None, "path": str(tmp_path / "images" / f"{i}.jpg")} for i in range(8)]
    cells[3]["path"] = str(tmp_path / "images" / "gone.jpg")
    cells.append({"bytes": None, "path": "images/6.jpg"})  # beside the table: the same file as row 6
    cells.append({"bytes": None, "path": "elsewhere/unknown.jpg"})  # relative to an unknown directory
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    pq.write_table(pa.table({"image": pa.array(cells, type=image_type), "label": pa.array([0, 1] * 5)}),
                   tmp_path / "train.parquet")
    result = run_data(tmp_path / "train.parquet")
    table = f"{tmp_path}/train.parquet"
    assert result.one("F101")["evidence"]["reasons"] == {
        f"{table}:image[3]": f"image file {tmp_path}/images/gone.jpg does not exist (datasets raises "
                             f"FileNotFoundError for this row)"}
    assert sorted(result.one("F109")["evidence"]["groups"]) == [[f"{table}:image[1]", f"{table}:image[5]"],
                                                                [f"{table}:image[6]", f"{table}:image[8]"]]
    assert result.report["extra"]["scan"]["images_decoded"] == 8
