"""diff: missing/unexpected/shape-mismatched keys and the proposed mapping; fix --model."""

from __future__ import annotations

import torch
from conftest import codes, nets_spec, sha256

from nndoctor.commands.ckpt.checkpoint import TensorInfo
from nndoctor.commands.ckpt.mapping import propose_mapping


def _infos(sd):
    return {k: TensorInfo.of(v) for k, v in sd.items()}


def test_mapping_prefix_and_structural_renames():
    from nets import Net, RenamedNet

    src = {"module." + k: v for k, v in Net().state_dict().items()}
    mapping = propose_mapping(_infos(src), _infos(RenamedNet().state_dict()))
    assert mapping.loads_strictly
    assert mapping.source_to_target["module.conv1.weight"] == "stem.weight"
    assert mapping.source_to_target["module.bn1.running_var"] == "stem_bn.running_var"
    assert mapping.source_to_target["module.fc.bias"] == "classifier.bias"
    assert mapping.source_to_target["module.conv2.weight"] == "conv2.weight"
    assert [r.kind for r in mapping.rules][0] == "strip-prefix"


def test_mapping_keeps_order_between_identical_blocks():
    # Two identical blocks renamed: first must map to first.
    src = {f"{name}.{p}": TensorInfo((4, 4), "float32") for name in ("a", "b") for p in ("weight", "bias")}
    dst = {f"{name}.{p}": TensorInfo((4, 4), "float32") for name in ("x", "y") for p in ("weight", "bias")}
    mapping = propose_mapping(src, dst)
    assert mapping.source_to_target == {"a.weight": "x.weight", "a.bias": "x.bias",
                                        "b.weight": "y.weight", "b.bias": "y.bias"}


def test_diff_against_model_proposes_renames(tmp_path, net, run_json):
    src = tmp_path / "old.pt"
    torch.save(net.state_dict(), src)
    code, report, result = run_json("ckpt", "diff", src, "--model", nets_spec("build_renamed"))
    assert code == 1
    assert codes(report) == ["C201"]
    diff = report["extra"]["diff"]
    assert diff["mapping"]["conv1.weight"] == "stem.weight"
    assert diff["mapping"]["fc.weight"] == "classifier.weight"
    assert diff["loads_strictly_after_mapping"] is True
    assert "rename conv1.* → stem.*" in result.out


def test_diff_head_changed(tmp_path, net, run_json):
    src = tmp_path / "old.pt"
    torch.save(net.state_dict(), src)
    code, report, _ = run_json("ckpt", "diff", src, "--model", nets_spec("build_100_classes"))
    head = next(f for f in report["findings"] if f["code"] == "C203")
    assert head["evidence"]["classes"] == [10, 100]
    assert head["evidence"]["module"] == "fc"
    assert "C202" not in codes(report)


def test_diff_shape_mismatch_not_a_head(tmp_path, net, run_json):
    src = tmp_path / "old.pt"
    torch.save(net.state_dict(), src)
    code, report, _ = run_json("ckpt", "diff", src, "--model", nets_spec("build_wider"))
    c202 = next(f for f in report["findings"] if f["code"] == "C202")
    assert any("conv2.weight" in m for m in c202["evidence"]["mismatches"])
    assert code == 1


def test_diff_two_checkpoints_lightning_prefix(tmp_path, net, run_json):
    lightning = tmp_path / "epoch=3.ckpt"
    torch.save({"state_dict": {"model." + k: v for k, v in net.state_dict().items()},
                "epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.4.0",
                "optimizer_states": [torch.optim.SGD(net.parameters(), lr=0.1).state_dict()]}, lightning)
    plain = tmp_path / "plain.pt"
    torch.save(net.state_dict(), plain)
    code, report, _ = run_json("ckpt", "diff", lightning, plain)
    assert report["extra"]["diff"]["rules"] == [{"kind": "strip-prefix", "old": "model.", "new": "", "keys": len(net.state_dict())}]
    code, report, _ = run_json("ckpt", "diff", plain, plain)
    assert code == 0 and report["findings"] == []


def test_fix_with_model_applies_mapping_and_verifies(tmp_path, net, run_json):
    src = tmp_path / "old.pt"
    torch.save({"module." + k: v for k, v in net.state_dict().items()}, src)
    before = sha256(src)
    out = tmp_path / "new.safetensors"
    code, report, result = run_json("ckpt", "fix", src, "-o", out, "--model", nets_spec("build_renamed"))
    assert code == 0, result.out
    assert "strict=True" in result.out
    from nets import RenamedNet
    from safetensors.torch import load_file

    model = RenamedNet()
    model.load_state_dict(load_file(out), strict=True)
    assert torch.equal(model.stem.weight, net.conv1.weight)
    assert torch.equal(model.stem_bn.running_var, net.bn1.running_var)
    assert torch.equal(model.classifier.bias, net.fc.bias)
    x = torch.randn(2, 3, 8, 8)
    net.eval(), model.eval()
    assert torch.allclose(net(x), model(x))
    assert sha256(src) == before


def test_fix_with_model_refuses_what_cannot_load(tmp_path, net, run_json):
    src = tmp_path / "old.pt"
    torch.save(net.state_dict(), src)
    out = tmp_path / "new.pt"
    code, report, _ = run_json("ckpt", "fix", src, "-o", out, "--model", nets_spec("build_100_classes"))
    assert code == 1 and not out.exists()
    assert "C203" in codes(report)
    # Dropping the head on purpose: written, loads with only the head missing.
    code, report, result = run_json("ckpt", "fix", src, "-o", out, "--model", nets_spec("build_100_classes"),
                                    "--drop", r"^fc\.")
    assert code == 0, result.out
    from nets import Net

    model = Net(classes=100)
    missing, unexpected = model.load_state_dict(torch.load(out, weights_only=True), strict=False)
    assert sorted(missing) == ["fc.bias", "fc.weight"] and unexpected == []


def test_missing_batchnorm_counters(tmp_path, net, run_json):
    old = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    src = tmp_path / "old.pt"
    torch.save(old, src)
    code, report, _ = run_json("ckpt", "diff", src, "--model", nets_spec("build"))
    assert codes(report) == ["C210"] and code == 0
    out = tmp_path / "new.pt"
    code, _, _ = run_json("ckpt", "fix", src, "-o", out, "--model", nets_spec("build"))
    assert code == 0
    fixed = torch.load(out, weights_only=True)
    assert fixed["bn1.num_batches_tracked"].dtype == torch.long


def test_dtype_mismatch(tmp_path, net, run_json):
    sd = {k: (v.half() if v.is_floating_point() else v.float()) for k, v in net.state_dict().items()}
    src = tmp_path / "half.pt"
    torch.save(sd, src)
    code, report, _ = run_json("ckpt", "diff", src, "--model", nets_spec("build"))
    c204 = next(f for f in report["findings"] if f["code"] == "C204")
    assert c204["evidence"]["dtypes"]["bn1.num_batches_tracked"] == ["float32", "int64"]


def test_bad_model_spec_is_a_usage_error(tmp_path, net, run_cli):
    src = tmp_path / "a.pt"
    torch.save(net.state_dict(), src)
    for spec, words in ((nets_spec("not_a_model"), "not a torch.nn.Module"),
                        (nets_spec("missing"), "has no attribute"),
                        ("no_such_module_xyz:build", "importing"),
                        ("nocolon", "MODULE:CALLABLE")):
        result = run_cli("ckpt", "diff", src, "--model", spec)
        assert result.code == 2 and words in result.err, result.err
