"""Wrapper prefixes (DataParallel, DDP, torch.compile): detected (C101) and repaired."""

from __future__ import annotations

import pytest
import torch
from conftest import codes, sha256

from nndoctor.commands.ckpt.prefixes import leading_wrapper_prefix


def _wrapped_state_dict(net, wrapper, tmp_path):
    if wrapper == "dataparallel":
        return torch.nn.DataParallel(net).state_dict()
    if wrapper == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        try:
            return torch.nn.parallel.DistributedDataParallel(net).state_dict()
        finally:
            dist.destroy_process_group()
    if wrapper == "compile":
        return torch.compile(net).state_dict()
    if wrapper == "compile+dataparallel":
        return torch.nn.DataParallel(torch.compile(net)).state_dict()
    raise AssertionError(wrapper)


EXPECTED_PREFIX = {"dataparallel": "module.", "ddp": "module.", "compile": "_orig_mod.",
                   "compile+dataparallel": "module._orig_mod."}


@pytest.mark.parametrize("wrapper", list(EXPECTED_PREFIX))
@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_wrapped_checkpoint_detected_and_repaired(tmp_path, net, run_json, wrapper, suffix):
    sd = _wrapped_state_dict(net, wrapper, tmp_path)
    assert leading_wrapper_prefix(sd) == EXPECTED_PREFIX[wrapper]
    src = tmp_path / "wrapped.pt"
    torch.save({"model": sd, "epoch": 4}, src)
    before = sha256(src)

    code, report, _ = run_json("ckpt", "inspect", src)
    c101 = [f for f in report["findings"] if f["code"] == "C101"]
    assert c101 and c101[0]["evidence"]["prefix"] == EXPECTED_PREFIX[wrapper]

    out = tmp_path / f"fixed{suffix}"
    code, report, result = run_json("ckpt", "fix", src, "-o", out)
    assert code == 0, result.out
    assert "C101" not in codes(report)
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        fixed = load_file(out)
    else:
        container = torch.load(out, weights_only=True)
        assert container["epoch"] == 4  # the rest of the checkpoint is kept
        fixed = container["model"]
    fresh = type(net)()
    fresh.load_state_dict(fixed, strict=True)
    for key, value in net.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    assert sha256(src) == before


def test_compiled_submodule_infix(tmp_path, net, run_json):
    holder = torch.nn.Module()
    holder.body = torch.compile(net)
    src = tmp_path / "infix.pt"
    torch.save(holder.state_dict(), src)
    code, report, _ = run_json("ckpt", "inspect", src)
    assert "C101" in codes(report)
    out = tmp_path / "out.pt"
    run_json("ckpt", "fix", src, "-o", out)
    keys = list(torch.load(out, weights_only=True))
    assert keys == ["body." + k for k in net.state_dict()]


def test_clean_checkpoint_is_silent(tmp_path, net, run_json):
    src = tmp_path / "clean.pt"
    torch.save(net.state_dict(), src)
    code, report, _ = run_json("ckpt", "inspect", src)
    assert code == 0 and report["findings"] == []


def test_explicit_options(tmp_path, net, run_json):
    src = tmp_path / "a.pt"
    torch.save(net.state_dict(), src)
    out = tmp_path / "b.pt"
    code, _, _ = run_json("ckpt", "fix", src, "-o", out, "--rename", r"^conv1\.=stem.",
                          "--drop", r"^fc\.", "--add-prefix", "net.")
    assert code == 0
    keys = list(torch.load(out, weights_only=True))
    assert "net.stem.weight" in keys and not any(".fc." in k or k.startswith("net.fc") for k in keys)
    assert len(keys) == len(net.state_dict()) - 2


def test_output_may_not_be_the_input(tmp_path, net, run_cli):
    src = tmp_path / "a.pt"
    torch.save(net.state_dict(), src)
    before = sha256(src)
    result = run_cli("ckpt", "fix", src, "-o", src)
    assert result.code == 2 and "never modifies" in result.err
    assert sha256(src) == before
