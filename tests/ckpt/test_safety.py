"""Safe loading: malicious pickles are reported and never executed; damaged files fail cleanly."""

from __future__ import annotations

import os
import pickle
import zipfile

import pytest
import torch
from conftest import codes, nets_spec, sha256

from nndoctor.commands.ckpt.pickle_scan import PickleCorrupt, scan_pickle


class _Evil:
    """Its __reduce__ makes unpickling run a shell command that creates a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_files(tmp_path, net):
    marker = tmp_path / "PWNED"
    raw = tmp_path / "evil.pkl"
    raw.write_bytes(pickle.dumps({"weight": [1.0, 2.0], "payload": _Evil(marker)}, protocol=4))
    zipped = tmp_path / "evil.pt"
    torch.save({"model": net.state_dict(), "payload": _Evil(marker)}, zipped)
    return marker, raw, zipped


def test_the_payload_is_real(tmp_path, net):
    # Guard against a test that passes because the payload never worked.
    marker, raw, _ = _evil_files(tmp_path, net)
    pickle.loads(raw.read_bytes())
    assert marker.exists()


@pytest.mark.parametrize("which", ["raw", "zipped"])
def test_malicious_pickle_reported_and_never_executed(tmp_path, net, run_json, which):
    marker, raw, zipped = _evil_files(tmp_path, net)
    path = raw if which == "raw" else zipped
    before = sha256(path)
    code, report, result = run_json("ckpt", "inspect", path)
    assert not marker.exists()
    assert code == 1
    c104 = [f for f in report["findings"] if f["code"] == "C104"]
    assert c104 and c104[0]["severity"] == "error"
    assert any(g.endswith(".system") for g in c104[0]["evidence"]["dangerous_globals"])
    assert "system" in c104[0]["message"] and "NOT loaded" in c104[0]["message"]
    assert "placeholders" in result.out
    # diff and fix read the same file: still nothing runs, and the state dict is usable.
    if which == "zipped":
        out = tmp_path / "clean.safetensors"
        code, report, _ = run_json("ckpt", "fix", path, "-o", out)
        assert not marker.exists()
        from safetensors.torch import load_file

        fresh = type(net)()
        fresh.load_state_dict(load_file(out), strict=True)
        for key, value in net.state_dict().items():
            assert torch.equal(fresh.state_dict()[key], value), key
        code, report, _ = run_json("ckpt", "diff", path, "--model", nets_spec("build"))
        assert not marker.exists()
    assert sha256(path) == before


def test_trust_does_load(tmp_path, net, run_cli):
    # --trust is the explicit opt-in; the marker proves the flag really changes behaviour.
    marker, raw, _ = _evil_files(tmp_path, net)
    run_cli("ckpt", "inspect", raw, "--trust")
    assert marker.exists()


def test_stack_global_through_memo_is_found():
    data = pickle.dumps(_Evil("/nonexistent/x"), protocol=4)
    found, count = scan_pickle(data)
    assert count == 1
    assert found.names == [f"{os.system.__module__}.system"]


def test_protocol2_builtin_names_are_normalised(tmp_path):
    data = pickle.dumps({1, 2}, protocol=2)
    found, _ = scan_pickle(data)
    assert found.names == ["builtins.set"]


def test_truncated_pickle_raises():
    data = pickle.dumps({"a": 1.0, "b": list(range(100))}, protocol=4)
    with pytest.raises(PickleCorrupt):
        scan_pickle(data[: len(data) // 2])


def test_whole_model_pickle_c103_and_extracted_without_running(tmp_path, net, run_json):
    path = tmp_path / "whole.pt"
    torch.save(net, path)
    code, report, _ = run_json("ckpt", "inspect", path)
    assert {"C103", "C104"} <= set(codes(report))
    c104 = next(f for f in report["findings"] if f["code"] == "C104")
    # Loading it imports and builds nets.Net: code outside the allowlist, so an error.
    assert c104["severity"] == "error" and code == 1
    assert any("nets.Net" in g for g in c104["evidence"]["unsafe_globals"])
    out = tmp_path / "sd.pt"
    code, report, _ = run_json("ckpt", "fix", path, "-o", out)
    assert code == 1 and report["extra"]["fix"]["written"]  # the input stays dangerous; the output is clean
    loaded = torch.load(out, weights_only=True)
    fresh = type(net)()
    fresh.load_state_dict(loaded, strict=True)
    for key, value in net.state_dict().items():
        assert torch.equal(loaded[key], value), key


def _truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("kind", ["zip", "legacy", "safetensors", "garbage", "empty", "zip-inner"])
def test_damaged_files_give_a_clear_error(tmp_path, net, run_cli, kind):
    path = tmp_path / ("bad.safetensors" if kind == "safetensors" else "bad.pt")
    if kind == "zip":
        torch.save(net.state_dict(), path)
        _truncate(path, 0.6)
    elif kind == "legacy":
        torch.save(net.state_dict(), path, _use_new_zipfile_serialization=False)
        _truncate(path, 0.5)
    elif kind == "safetensors":
        from safetensors.torch import save_file

        save_file(net.state_dict(), str(path))
        _truncate(path, 0.7)
    elif kind == "garbage":
        path.write_bytes(b"this is not a checkpoint at all" * 10)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "zip-inner":
        # A complete zip whose data.pkl is cut short.
        torch.save(net.state_dict(), path)
        with zipfile.ZipFile(path) as src:
            entries = {n: src.read(n) for n in src.namelist()}
        pkl = next(n for n in entries if n.endswith("data.pkl"))
        entries[pkl] = entries[pkl][:40]
        with zipfile.ZipFile(path, "w") as dst:
            for name, data in entries.items():
                dst.writestr(name, data)
    result = run_cli("ckpt", "inspect", path)
    assert result.code == 2
    assert result.err.startswith("nndoctor: error: ")
    assert str(path) in result.err
    assert any(word in result.err for word in ("truncated", "corrupted", "empty", "not a recognised"))
    assert "Traceback" not in result.err + result.out
