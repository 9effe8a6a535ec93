"""ckpt inspect on s3:// URLs, against a real S3-compatible server (moto's server mode, bound
to 127.0.0.1) reached through s3fs: the checkpoint is read in place with ranged reads."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import FIXTURES, codes

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

TF_SMALL = FIXTURES / "tf_small"


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """A local S3 server with bucket ``ckpts``: the small TensorFlow checkpoint folder and a
    safetensors file with an Inf. Credentials and endpoint come from the environment, as for users."""
    import fsspec
    from safetensors.numpy import save_file

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}"}.items():
            patch.setenv(name, value)
        patch.delenv("AWS_PROFILE", raising=False)
        fsspec.filesystem("s3").clear_instance_cache()  # a cached client would keep another endpoint
        fs = fsspec.filesystem("s3")
        fs.mkdir("ckpts")
        for path in TF_SMALL.iterdir():
            fs.put_file(str(path), f"ckpts/tf_small/{path.name}")
        weights = {"fc.weight": np.ones((3, 4), dtype="float32"),
                   "fc.bias": np.array([0.0, np.inf, 1.0], dtype="float32")}
        local = tmp_path_factory.mktemp("s3") / "model.safetensors"
        save_file(weights, local, metadata={"step": "7"})
        fs.put_file(str(local), "ckpts/model.safetensors")
        yield "ckpts"
        fs.clear_instance_cache()
    server.stop()


@pytest.fixture
def reads(monkeypatch):
    """Every ranged read nndoctor makes: (object, offset, length)."""
    from nndoctor.commands.ckpt.remote import RemoteFiles

    calls = []
    original = RemoteFiles.read

    def read(self, name, offset, length):
        calls.append((name, offset, length))
        return original(self, name, offset, length)

    monkeypatch.setattr(RemoteFiles, "read", read)
    return calls


@pytest.mark.parametrize("spelling", ["tf_small", "tf_small/", "tf_small/ckpt-1", "tf_small/ckpt-1.index"],
                         ids=["folder", "folder-slash", "prefix", "index"])
def test_tf_checkpoint_on_s3_matches_the_local_read(bucket, run_json, run_cli, reads, spelling, tmp_path):
    run_cli("ckpt", "inspect", TF_SMALL, "--json", tmp_path / "local.json")
    local = json.loads((tmp_path / "local.json").read_text())
    code, remote, result = run_json("ckpt", "inspect", f"s3://{bucket}/{spelling}")
    assert code == 1 and codes(remote) == codes(local) == ["C209"], result.err
    assert remote["extra"]["checkpoint"]["state_dicts"] == local["extra"]["checkpoint"]["state_dicts"]
    assert remote["extra"]["checkpoint"]["metadata"]["prefix"] == f"s3://{bucket}/tf_small/ckpt-1"
    assert "net/dense/bias" in remote["findings"][0]["message"]
    # ranged reads: the data shard is read tensor by tensor, never as one whole-object GET
    shard = [(offset, length) for name, offset, length in reads if name.endswith(".data-00000-of-00001")]
    shard_size = (TF_SMALL / "ckpt-1.data-00000-of-00001").stat().st_size
    assert len(shard) >= 3 and all(length < shard_size for _offset, length in shard)


def test_safetensors_on_s3(bucket, run_json, reads):
    code, report, _ = run_json("ckpt", "inspect", f"s3://{bucket}/model.safetensors")
    assert code == 1 and codes(report) == ["C209"]
    checkpoint = report["extra"]["checkpoint"]
    assert checkpoint["format"] == "safetensors" and checkpoint["metadata"] == {"step": "7"}
    assert checkpoint["state_dicts"][0]["keys"] == {"fc.weight": {"shape": [3, 4], "dtype": "float32"},
                                                     "fc.bias": {"shape": [3], "dtype": "float32"}}
    assert {length for _name, _offset, length in reads} >= {8, 48, 12}  # header size, one tensor each


def test_missing_object_and_unsupported_format_are_clear(bucket, run_cli, tmp_path):
    result = run_cli("ckpt", "inspect", f"s3://{bucket}/nothing-here.pt")
    assert result.code == 2 and "no such object" in result.err and "Traceback" not in result.err
    import fsspec

    fsspec.filesystem("s3").pipe_file(f"{bucket}/model.h5", b"\x89HDF\r\n\x1a\n" + b"\x00" * 60)
    result = run_cli("ckpt", "inspect", f"s3://{bucket}/model.h5")
    assert result.code == 2 and "copy it to a local file first" in result.err
    fsspec.filesystem("s3").pipe_file(f"{bucket}/broken.pt", b"PK\x03\x04" + b"\x00" * 60)
    result = run_cli("ckpt", "inspect", f"s3://{bucket}/broken.pt")
    assert result.code == 2 and "corrupted zip checkpoint" in result.err and "Traceback" not in result.err


def test_pytorch_checkpoint_on_s3_matches_the_local_read(bucket, run_json, run_cli, reads, tmp_path):
    import fsspec
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 4))
    local = tmp_path / "wrapped.pt"
    torch.save({"model": {"module." + k: v for k, v in net.state_dict().items()}, "epoch": 3}, local)
    fsspec.filesystem("s3").put_file(str(local), f"{bucket}/wrapped.pt")
    run_cli("ckpt", "inspect", local, "--json", tmp_path / "local.json")
    expected = json.loads((tmp_path / "local.json").read_text())["extra"]["checkpoint"]
    code, report, result = run_json("ckpt", "inspect", f"s3://{bucket}/wrapped.pt")
    assert code == 0 and codes(report) == ["C101"], result.err
    checkpoint = report["extra"]["checkpoint"]
    assert checkpoint["format"] == "pytorch-zip" and checkpoint["read_mode"] == "weights_only"
    assert checkpoint["state_dicts"] == expected["state_dicts"]
    assert checkpoint["other_entries"] == expected["other_entries"] == {"epoch": "3"}


def test_missing_protocol_package_is_named(run_cli):
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed")
    result = run_cli("ckpt", "inspect", "gs://bucket/model.safetensors")
    assert result.code == 2 and "needs gcsfs" in result.err and "Traceback" not in result.err
