"""``nndoctor data s3://…`` against a real S3-compatible server (moto in server mode, on
127.0.0.1): image folders, WebDataset shards, Parquet and HDF5 read in place by ranged reads."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from conftest import photo
from test_data_formats import encoded, truncated_jpeg, write_parquet, write_shard

s3fs = pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")
h5py = pytest.importorskip("h5py")

pytestmark = pytest.mark.slow  # a real HTTP server and S3 round trips: 1–7 s a test on a loaded VM

BUCKET = "datasets"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def endpoint():
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def bucket(endpoint, monkeypatch):
    """An empty bucket; credentials and endpoint come from the environment, as for a user."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": endpoint}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    s3fs.S3FileSystem.clear_instance_cache()
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    client.delete_bucket(Bucket=BUCKET)
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def fetched(monkeypatch):
    """Bytes s3fs fetched from the server, by ranged GETs of open files and whole-object reads."""
    counted = {"bytes": 0}
    ranged = s3fs.core.S3File._fetch_range

    def counting(self, start, end):
        data = ranged(self, start, end)
        counted["bytes"] += len(data)
        return data

    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", counting)
    return counted


def put(client, key: str, data: bytes) -> None:
    client.put_object(Bucket=BUCKET, Key=key, Body=data)


def test_s3_image_folder(bucket, run_data):
    seed = 0
    for split, count in (("train", 6), ("val", 3)):
        for cls in ("cat", "dog"):
            for i in range(count):
                seed += 1
                put(bucket, f"pets/{split}/{cls}/{i}.jpg", encoded(seed))
    put(bucket, "pets/train/cat/cut.jpg", truncated_jpeg(500))
    put(bucket, "pets/val/dog/copy.jpg", encoded(9))  # train/dog/2.jpg: the 9th image written
    result = run_data(f"s3://{BUCKET}/pets/")
    assert result.one("F101")["evidence"]["files"] == [f"s3://{BUCKET}/pets/train/cat/cut.jpg"]
    assert result.one("F110")["evidence"]["pairs"][0] == {
        "file": f"s3://{BUCKET}/pets/val/dog/copy.jpg", "duplicate_of": f"s3://{BUCKET}/pets/train/dog/2.jpg",
        "distance": 0}
    assert result.report["extra"]["splits"] == ["train", "val"]
    assert result.report["extra"]["scan"]["cache"] is None  # objects have no mtime to key a cache on


def test_s3_webdataset_shards_and_parquet(bucket, run_data, tmp_path):
    for shard in range(2):
        path = tmp_path / f"shard-{shard:06d}.tar"
        samples = [(f"{shard}{i:03d}", {"jpg": encoded(shard * 50 + i), "cls": b"1"}) for i in range(5)]
        if shard == 1:
            samples[2][1]["jpg"] = truncated_jpeg(9)
        write_shard(path, samples)
        put(bucket, f"wds/shard-{shard:06d}.tar", path.read_bytes())
    result = run_data(f"s3://{BUCKET}/wds/shard-{{000000..000001}}.tar")
    assert result.one("F101")["evidence"]["files"] == [f"s3://{BUCKET}/wds/shard-000001.tar:1002.jpg"]
    images = [encoded(i) for i in range(10)]
    images[6] = images[1]
    write_parquet(tmp_path / "train.parquet", images, [0, 1] * 5, ["a", "b"])
    put(bucket, "hf/data/train-00000-of-00001.parquet", (tmp_path / "train.parquet").read_bytes())
    table = run_data(f"s3://{BUCKET}/hf/")
    assert table.one("F109")["evidence"]["files"] == [
        f"s3://{BUCKET}/hf/data/train-00000-of-00001.parquet:image[1]",
        f"s3://{BUCKET}/hf/data/train-00000-of-00001.parquet:image[6]"]


def test_s3_hdf5_is_read_by_ranges_not_downloaded(bucket, run_data, tmp_path, fetched):
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as handle:
        handle["images"] = np.stack([np.asarray(photo(i, 32, 32)) for i in range(8)])
        handle["images"][5] = handle["images"][2]
        handle["labels"] = np.arange(8) % 2
        # 24 MB that nndoctor has no reason to read (chunked: h5py reads only what it touches).
        handle.create_dataset("embeddings", data=np.random.default_rng(0).random((3000, 1000)), chunks=(100, 1000))
    size = path.stat().st_size
    put(bucket, "h5/train.h5", path.read_bytes())
    result = run_data(f"s3://{BUCKET}/h5/train.h5")
    assert result.one("F109")["evidence"]["files"] == [f"s3://{BUCKET}/h5/train.h5:images[2]",
                                                       f"s3://{BUCKET}/h5/train.h5:images[5]"]
    assert 0 < fetched["bytes"] < size / 4, (fetched["bytes"], size)
    print(f"fetched {fetched['bytes']:,} of {size:,} bytes")


def test_missing_object_and_missing_backend_messages(bucket, run_data, monkeypatch):
    result = run_data(f"s3://{BUCKET}/nothing/here.tar")
    assert result.rc == 2 and "no such object" in result.err
    unknown = run_data("nosuchproto://bucket/x.tar")
    assert unknown.rc == 2 and "cannot open this URL" in unknown.err


def test_s3_tfrecords(bucket, run_data, tmp_path):
    from conftest import example, frame, jpeg_bytes

    records = [frame(example({"image/encoded": jpeg_bytes(i), "label": [i]})) for i in range(3)]
    broken = bytearray(records[1])
    broken[20] ^= 0x01
    put(bucket, "tf/train-00000-of-00002.tfrecord", b"".join(records))
    put(bucket, "tf/train-00001-of-00002.tfrecord", records[0] + bytes(broken) + records[2])
    result = run_data(f"s3://{BUCKET}/tf/train-*.tfrecord")
    finding = result.one("F201")
    assert finding["evidence"]["files"] == [f"s3://{BUCKET}/tf/train-00001-of-00002.tfrecord"]
    assert "train-00001-of-00002.tfrecord#1" in " ".join(finding["evidence"]["records"])
    assert result.report["extra"]["scan"]["tfrecord_records"] == 6


def test_s3_npy_pairs_read_labels_by_ranges(bucket, run_data, tmp_path):
    images = np.stack([np.asarray(photo(i, 32, 32)) for i in range(20)])
    images[9] = images[2]
    for name, array in (("X_train.npy", images), ("y_train.npy", np.array([0] * 12 + [1] * 7 + [2]))):
        np.save(tmp_path / name, array)
        put(bucket, f"npy/{name}", (tmp_path / name).read_bytes())
    result = run_data(f"s3://{BUCKET}/npy/")
    assert result.one("F109")["evidence"]["files"] == [f"s3://{BUCKET}/npy/X_train.npy[2]",
                                                       f"s3://{BUCKET}/npy/X_train.npy[9]"]
    assert result.one("F108")["evidence"]["counts"] == {"0": 12, "1": 7, "2": 1}  # labels read from S3
