"""inspect: formats, containers, tree output, JSON, NaN weights; Keras files without Keras."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch
from conftest import codes, sha256

from tests import childproc


def test_container_recognised(tmp_path, net, run_json):
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    path = tmp_path / "train.pt"
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 7}, path)
    code, report, result = run_json("ckpt", "inspect", path)
    info = report["extra"]["checkpoint"]
    assert code == 0 and report["findings"] == []
    assert info["read_mode"] == "weights_only"
    [sd] = info["state_dicts"]
    assert sd["where"] == "model" and sd["tensors"] == len(net.state_dict())
    assert sd["parameters"] == sum(v.numel() for v in net.state_dict().values())
    assert sd["keys"]["conv1.weight"] == {"shape": [8, 3, 3, 3], "dtype": "float32"}
    assert info["other_entries"]["epoch"] == "7"
    assert "momentum=0.9" in info["other_entries"]["optimizer"]
    assert "conv1" in result.out and "[8, 3, 3, 3]" in result.out


@pytest.mark.parametrize("fmt", ["legacy", "safetensors", "lightning"])
def test_formats(tmp_path, net, run_json, fmt):
    sd = net.state_dict()
    if fmt == "legacy":
        path = tmp_path / "old.pth"
        torch.save(sd, path, _use_new_zipfile_serialization=False)
        expected_format, where = "pytorch-legacy", ""
    elif fmt == "safetensors":
        from safetensors.torch import save_file

        path = tmp_path / "w.safetensors"
        save_file(sd, str(path), metadata={"step": "5"})
        expected_format, where = "safetensors", ""
    else:
        path = tmp_path / "last.ckpt"
        torch.save({"state_dict": {"model." + k: v for k, v in sd.items()}, "epoch": 1,
                    "hyper_parameters": {"lr": 0.1}}, path)
        expected_format, where = "pytorch-zip", "state_dict"
    code, report, _ = run_json("ckpt", "inspect", path)
    info = report["extra"]["checkpoint"]
    assert info["format"] == expected_format
    [found] = info["state_dicts"]
    assert found["where"] == where and found["tensors"] == len(sd)
    if fmt == "safetensors":
        assert info["metadata"] == {"step": "5"}


def test_nonfinite_weights(tmp_path, net, run_json):
    sd = net.state_dict()
    sd["fc.weight"][0, :3] = float("nan")
    path = tmp_path / "nan.pt"
    torch.save(sd, path)
    code, report, _ = run_json("ckpt", "inspect", path)
    assert code == 1
    finding = next(f for f in report["findings"] if f["code"] == "C209")
    assert finding["evidence"]["nonfinite_values"] == {"fc.weight": 3}


def test_json_to_stdout_is_pure_json(tmp_path, net, run_cli):
    path = tmp_path / "a.pt"
    torch.save({"module." + k: v for k, v in net.state_dict().items()}, path)
    result = run_cli("ckpt", "inspect", path, "--json", "-")
    data = json.loads(result.out)
    assert data["tool"] == "nndoctor" and data["schema"] == 1
    assert [f["code"] for f in data["findings"]] == ["C101"]


def test_select_ignore_and_fail_on(tmp_path, net, run_json):
    path = tmp_path / "a.pt"
    torch.save({"module." + k: v for k, v in net.state_dict().items()}, path)
    _, report, _ = run_json("ckpt", "inspect", path, "--ignore", "C101")
    assert report["findings"] == []
    code, report, _ = run_json("ckpt", "inspect", path, "--fail-on", "info")
    assert code == 1 and codes(report) == ["C101"]


def _keras_free_script(path: str) -> str:
    return (
        "import sys\n"
        "from nndoctor.cli import main\n"
        f"code = main(['ckpt', 'inspect', {path!r}, '--json', '-'])\n"
        "assert 'keras' not in sys.modules, 'inspect imported keras'\n"
        "assert 'tensorflow' not in sys.modules\n"
        "sys.exit(code)\n"
    )


def _write_keras3_weights(path):
    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as handle:
        handle.create_group("vars").attrs["name"] = "sequential"
        for group, arrays in (("conv2d", [(3, 3, 3, 4), (4,)]), ("dense", [(4, 2), (2,)]),
                              ("batch_normalization", [(4,)] * 4)):
            vars_group = handle.create_group(f"layers/{group}/vars")
            vars_group.attrs["name"] = group
            for i, shape in enumerate(arrays):
                vars_group.create_dataset(str(i), data=rng.standard_normal(shape).astype("float32"))


def test_keras_weights_inspected_with_h5py_only(tmp_path):
    path = tmp_path / "w.weights.h5"
    _write_keras3_weights(path)
    before = sha256(path)
    result = childproc.run([sys.executable, "-c", _keras_free_script(str(path))], env={**os.environ, "KERAS_BACKEND": "torch"}, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    keys = data["extra"]["checkpoint"]["state_dicts"][0]["keys"]
    assert keys["conv2d/kernel"]["shape"] == [3, 3, 3, 4]
    assert keys["batch_normalization/moving_variance"]["shape"] == [4]
    assert keys["dense/bias"]["shape"] == [2]
    assert sha256(path) == before


def test_ckpt_checks_are_documented():
    from nndoctor.core.registry import DOC_HEADINGS, all_checks

    ckpt_checks = all_checks("ckpt")
    assert [c.code for c in ckpt_checks] == [f"C2{i:02d}" for i in range(1, 11)]
    for cls in ckpt_checks:
        assert list(cls.doc_sections()) == list(DOC_HEADINGS), cls.code
        assert all(cls.doc_sections().values()), cls.code
        assert cls.summary and cls.fix and cls.name == cls.name.lower() and " " not in cls.name


def test_no_action_prints_help(run_cli):
    result = run_cli("ckpt")
    assert result.code == 2 and "inspect" in result.out


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_huge_integers_are_shown_shortened_without_a_traceback(tmp_path, net, run_cli, legacy):
    # Python refuses str() of an int beyond 4,300 digits (ValueError): as a value, a dict key,
    # inside a tuple key or an optimizer hyper-parameter, inspect shows it shortened.
    huge = 7 ** 6000                                            # 5,071 digits
    path = tmp_path / "huge.pt"
    torch.save({"model": net.state_dict(), "seed": huge, "meta": {huge: "key", "n": -huge, (huge, 1): 2},
                "opt": {"state": {}, "param_groups": [{"lr": huge, "params": []}]}}, path,
               _use_new_zipfile_serialization=not legacy)
    before = sha256(path)
    json_path = tmp_path / "report.json"
    result = run_cli("ckpt", "inspect", path, "--json", json_path)
    assert result.code == 0, result.err
    assert "Traceback" not in result.err and "ValueError" not in result.err + result.out
    shown = "38747178…600001 (an int of 5,071 digits)"           # 7**6000: first 8 and last 6 digits
    entries = json.loads(json_path.read_text())["extra"]["checkpoint"]["other_entries"]
    assert entries["seed"] == shown and entries["meta.n"] == "-" + shown
    assert entries[f"meta.{shown}"] == "'key'" and entries[f"meta.({shown}, 1)"] == "2"
    assert f"lr={shown}" in entries["opt"]
    assert f"seed: {shown}" in result.out
    assert sha256(path) == before


def test_int_text_is_exact_where_it_shows_digits():
    from nndoctor.commands.ckpt.containers import int_text

    assert int_text(10 ** 79) == "1" + "0" * 79                 # 80 digits: shown whole
    assert int_text(10 ** 80) == "10000000…000000 (an int of 81 digits)"
    assert int_text(-(10 ** 80) + 1) == "-" + "9" * 80          # 80 nines: shown whole
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        for n in (3 ** 20000 + 12345, -(2 ** 50000), 10 ** 5000):
            text = str(abs(n))
            expected = f"{'-' if n < 0 else ''}{text[:8]}…{text[-6:]} (an int of {len(text):,} digits)"
            assert int_text(n) == expected
    finally:
        sys.set_int_max_str_digits(limit)
