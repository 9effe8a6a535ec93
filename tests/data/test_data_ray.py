"""``--engine ray``: the same report as the local scan, on a local Ray with 2 workers."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from conftest import photo
from test_data_formats import encoded, truncated_jpeg, write_shard

from tests import childproc

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
h5py = pytest.importorskip("h5py")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # ray.init installs a SIGTERM handler calling sys.exit(15); later tests in this worker fork
    # children that must inherit the handler they had before (tests/hostile).
    sigterm_before = signal.getsignal(signal.SIGTERM)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    signal.signal(signal.SIGTERM, sigterm_before)


def comparable(result) -> list[tuple]:
    return [(f["code"], f["severity"], f["message"], f["location"], f["evidence"]) for f in result.findings]


def test_ray_engine_gives_the_local_report(build, run_data, tmp_path):
    root = build.imagefolder(per_class=4)
    build.image("train/cat/gray.jpg", mode="L")
    (root / "train" / "dog" / "cut.jpg").write_bytes(truncated_jpeg(3))
    (root / "val" / "owl" / "copy.jpg").write_bytes((root / "train" / "owl" / "001.jpg").read_bytes())
    shards = tmp_path / "shards"
    shards.mkdir()
    for shard in range(2):
        samples = [(f"{shard}{i:03d}", {"jpg": encoded(300 + shard * 10 + i), "cls": str(i % 2).encode()})
                   for i in range(6)]
        samples[4][1]["jpg"] = encoded(300)  # a duplicate of shard 0's first sample
        write_shard(shards / f"train-{shard:06d}.tar", samples)
    with h5py.File(tmp_path / "extra.h5", "w") as handle:
        handle["images"] = np.stack([np.asarray(photo(i, 32, 32)) for i in range(10)])
        handle["labels"] = np.arange(10) % 2
    expected = {"F101", "F102", "F110", "F113"}, {"F109", "F113"}
    for args, codes in zip(((root,), (str(shards / "train-{000000..000001}.tar"), tmp_path / "extra.h5")), expected):
        local = run_data(*args, "--no-cache", workers=2)
        distributed = run_data(*args, "--no-cache", "--engine", "ray", workers=2)
        assert codes <= local.codes()
        assert comparable(distributed) == comparable(local)
        assert distributed.report["extra"]["scan"]["engine"] == "ray"
        assert distributed.report["extra"]["scan"]["workers"] == 2


def test_address_of_a_running_cluster(run_data, tmp_path):
    """``--address HOST:PORT``: a separate nndoctor process joins the running local cluster (as a
    driver on a cluster's node does) and gives the local scan's report. The cluster stays up."""
    import json
    import os
    import sys

    with h5py.File(tmp_path / "train.h5", "w") as handle:
        images = np.stack([np.asarray(photo(i, 32, 32)) for i in range(12)])
        images[7] = images[2]
        handle["images"] = images
        handle["labels"] = np.arange(12) % 2
    local = run_data(tmp_path / "train.h5", "--no-cache")
    address = ray.get_runtime_context().gcs_address
    report = tmp_path / "ray.json"
    # ray.init set RAY_AUTH_MODE in this process when it enabled token authentication: inherited
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = childproc.run([sys.executable, "-m", "nndoctor", "data", str(tmp_path / "train.h5"), "--no-cache",
                          "--engine", "ray", "--address", address, "--workers", "1", "--json", str(report)],
                         timeout=300, env=env)
    assert done.returncode == local.rc, done.stderr[-3000:]
    distributed = json.loads(report.read_text())
    assert local.one("F109")["evidence"]["files"] == [f"{tmp_path}/train.h5:images[2]", f"{tmp_path}/train.h5:images[7]"]
    assert [(f["code"], f["message"], f["evidence"]) for f in distributed["findings"]] == comparable_json(local)
    # the cluster's 2 CPUs, not --workers 1: the scan joined the cluster instead of starting its own
    assert distributed["extra"]["scan"]["engine"] == "ray" and distributed["extra"]["scan"]["workers"] == 2
    assert ray.is_initialized() and ray.cluster_resources().get("CPU") == 2  # not shut down by the scan


def comparable_json(result) -> list[tuple]:
    return [(f["code"], f["message"], f["evidence"]) for f in result.findings]
