"""ckpt inspect / diff / convert on TensorFlow checkpoints and SavedModel folders.

The files are written once per module by TensorFlow itself, in one subprocess
(``tests/ckpt/tf_checkpoint_builder.py``, in the TensorFlow child of ``tests/tf_process.py``:
this session's Keras runs on the torch backend, and TensorFlow's import takes seconds), which also records what ``tf.train.load_checkpoint``
reads back. nndoctor reads the bundles without TensorFlow. Measured: ~10 s of CPU for the
builder (TensorFlow's import, one Keras fit step, two SavedModel exports).
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest
from conftest import FIXTURES, codes, sha256

from tests import childproc, tf_process
from tests.conftest import needs

pytestmark = [needs("tensorflow"), pytest.mark.xdist_group(tf_process.GROUP), pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


PAIRS = str(FIXTURES / "keras_pairs.py")


@pytest.fixture(scope="module")
def built(request):
    out = tf_process.part_folder(request, "checkpoints")  # the builder ran in the shared TensorFlow child
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["root"] = out
    manifest["expected"] = dict(np.load(out / "expected.npz"))
    return manifest


def _hashes(folder):
    return {p: sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_bundle_reader_agrees_with_tensorflow(built):
    from nndoctor.commands.ckpt.tf_bundle import OBJECT_GRAPH_KEY, TensorBundle

    root = built["root"]
    prefixes = {"first": built["cnn_first"], "second": built["cnn_second"], "wide": built["wide"],
                "deeper": built["deeper"],
                "guarded": root / "guarded_saved/variables/variables",
                "cnn_saved": root / "cnn_saved/variables/variables"}
    compared = 0
    for name, prefix in prefixes.items():
        bundle = TensorBundle(str(prefix))
        expected = {k.split("|", 1)[1]: v for k, v in built["expected"].items() if k.startswith(name + "|")}
        assert set(bundle.entries) - {OBJECT_GRAPH_KEY} == set(expected)
        for key, value in expected.items():
            got = bundle.read(key)
            assert got.shape == value.shape, key
            assert np.array_equal(np.asarray(got, dtype=value.dtype), value), key
            compared += 1
    assert compared > 40
    dtypes = {e.dtype for e in TensorBundle(str(prefixes["guarded"])).entries.values()}
    assert {"float32", "int64", "float16", "bfloat16", "bool", "string"} <= dtypes


@pytest.mark.parametrize("spelling", ["folder", "prefix", "index", "shard"])
def test_inspect_accepts_every_spelling_of_a_checkpoint(built, run_json, spelling):
    second = built["cnn_second"]
    path = {"folder": os.path.dirname(second), "prefix": second, "index": second + ".index",
            "shard": second + ".data-00000-of-00001"}[spelling]
    code, report, result = run_json("ckpt", "inspect", path)
    assert code == 0, result.out + result.err
    checkpoint = report["extra"]["checkpoint"]
    assert checkpoint["format"] == "tf-checkpoint"
    assert checkpoint["metadata"]["prefix"] == second  # the folder's state file names the latest: ckpt-2
    model = checkpoint["state_dicts"][0]
    assert model["where"] == "" and model["tensors"] == 8
    shapes = sorted(tuple(v["shape"]) for v in model["keys"].values())
    assert shapes == sorted(tuple(s) for s in built["cnn_paths"].values())
    assert checkpoint["state_dicts"][1]["where"] == "optimizer"
    assert checkpoint["other_entries"]["save_counter"] == "2"
    # the Keras layer structure, named as Keras named the variables
    assert "Keras layers: 3 with weights" in result.out
    for line in ("conv2d  conv2d", "batch_normalization  batch_normalization", "dense  dense",
                 "kernel  [64, 3]  float32", "moving_variance  [4]  float32"):
        assert line in result.out, line


def test_savedmodel_is_inspected_without_running_or_importing_tensorflow(built, tmp_path):
    assert built["guarded_raises"] is True  # its function does raise when TensorFlow runs it
    folder = built["root"] / "guarded_saved"
    before = _hashes(folder)
    script = ("import sys\nfrom nndoctor.cli import main\n"
              f"code = main(['ckpt', 'inspect', {str(folder)!r}, '--json', '-'])\n"
              "assert 'tensorflow' not in sys.modules, 'inspect imported TensorFlow'\n"
              "sys.exit(code)\n")
    done = childproc.run([sys.executable, "-c", script], timeout=120,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    checkpoint = report["extra"]["checkpoint"]
    assert checkpoint["format"] == "tf-savedmodel"
    keys = checkpoint["state_dicts"][0]["keys"]
    assert keys == {"weights_f32": {"shape": [2, 3], "dtype": "float32"},
                    "steps": {"shape": [2], "dtype": "int64"},
                    "half": {"shape": [2], "dtype": "float16"},
                    "brain": {"shape": [3], "dtype": "bfloat16"},
                    "flags": {"shape": [2], "dtype": "bool"}}
    assert "not loaded" in checkpoint["other_entries"]["saved_model.pb"]
    assert _hashes(folder) == before


def test_keras_export_savedmodel_shows_each_variable_once(built, run_json):
    code, report, result = run_json("ckpt", "inspect", built["root"] / "cnn_saved")
    assert code == 0
    checkpoint = report["extra"]["checkpoint"]
    assert [sd["tensors"] for sd in checkpoint["state_dicts"]] == [8]  # not the _all_variables copies
    assert "Keras layers: 3 with weights" in result.out


def test_diff_of_two_steps_reports_changed_values_only(built, run_json):
    code, report, result = run_json("ckpt", "diff", built["cnn_first"], built["cnn_second"])
    assert code == 0 and report["findings"] == []
    diff = report["extra"]["diff"]
    assert diff["exact"] == 8 and not diff["missing"] and not diff["unexpected"]
    first, second = built["expected"], built["expected"]
    kernel = "model/_functional/_operations/1/_kernel"
    stored = "optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"  # where TensorFlow put it
    expected_change = float(np.max(np.abs(first[f"first|{stored}"] - second[f"second|{stored}"])))
    assert diff["changed_values"][kernel] == pytest.approx(expected_change)
    assert len(diff["changed_values"]) == 8
    assert "values: 8 of 8 matched tensors differ" in result.out
    assert "same variables at the same object paths" in result.out and "load_state_dict" not in result.out


def _copy(built, tmp_path, name):
    """A copy of a built folder under this test's tmp_path (snapshots mask only that path)."""
    shutil.copytree(built["root"] / name, tmp_path / name)
    return tmp_path / name


def test_diff_against_a_resized_head(built, run_json, tmp_path):
    mine, other = _copy(built, tmp_path, "cnn"), _copy(built, tmp_path, "wide")
    code, report, _ = run_json("ckpt", "diff", mine, other / "ckpt")
    assert code == 0 and codes(report) == ["C203"]  # a warning
    diff = report["extra"]["diff"]
    assert diff["exact"] == 6 and not diff["missing"] and not diff["unexpected"]
    assert sorted(tuple(h[2:]) for h in diff["head_changes"]) == [([3], [5]), ([64, 3], [64, 5])]
    assert "model/_functional/_operations/5" in report["findings"][0]["message"]


def test_diff_against_a_deeper_model(built, run_json, tmp_path):
    mine, other = _copy(built, tmp_path, "cnn"), _copy(built, tmp_path, "deeper")
    code, report, _ = run_json("ckpt", "diff", mine, other / "ckpt")
    assert code == 1 and codes(report) == ["C201"]
    diff = report["extra"]["diff"]
    assert diff["missing"] == ["model/_functional/_operations/6/_kernel", "model/_functional/_operations/6/bias"]
    message = report["findings"][0]["message"]
    assert "load_state_dict" not in message and "assert_consumed" in message  # restored by object path


def test_convert_checkpoint_verified_against_keras_and_tensorflow(built, run_json, tmp_path):
    import torch
    from safetensors.torch import load_file

    folder = built["root"] / "cnn"
    before = _hashes(folder)
    out = tmp_path / "cnn.safetensors"
    code, report, result = run_json("ckpt", "convert", folder, "-o", out, "--model", f"{PAIRS}:torch_cnn",
                                    "--keras-model", f"{PAIRS}:keras_cnn")
    assert code == 0, result.out + result.err
    verification = report["extra"]["convert"]["verification"]
    assert verification["max_abs_diff"] < 1e-4
    # independently: the PyTorch twin with the written weights gives TensorFlow's own outputs
    import keras_pairs

    model = keras_pairs.torch_cnn()
    model.load_state_dict(load_file(out), strict=True)
    model.eval()
    x = np.load(built["root"] / "cnn_input.npy")
    with torch.no_grad():
        got = model(torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1)))).numpy()
    assert np.max(np.abs(got - np.load(built["root"] / "cnn_output.npy"))) < 1e-4
    assert _hashes(folder) == before


def test_convert_savedmodel_without_keras_model_is_unverified(built, run_json, tmp_path):
    out = tmp_path / "saved.safetensors"
    code, report, _ = run_json("ckpt", "convert", _copy(built, tmp_path, "cnn_saved"), "-o", out,
                               "--model", f"{PAIRS}:torch_cnn")
    assert code == 0 and codes(report) == ["C208"]
    assert "TensorFlow checkpoint and no --keras-model" in report["findings"][0]["message"]
    assert out.exists()


def test_convert_refuses_a_checkpoint_without_keras_layers(built, run_cli, tmp_path):
    result = run_cli("ckpt", "convert", built["root"] / "guarded_saved", "-o", tmp_path / "x.safetensors",
                     "--model", f"{PAIRS}:torch_cnn")
    assert result.code == 2 and "not Keras layers" in result.err
    assert not (tmp_path / "x.safetensors").exists()


def test_damaged_bundles_get_clear_messages(built, run_cli, tmp_path):
    source = built["root"] / "cnn"
    copy = tmp_path / "cnn"
    shutil.copytree(source, copy)
    shard = copy / "ckpt-2.data-00000-of-00001"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = run_cli("ckpt", "inspect", copy)
    assert result.code == 2 and "checksum mismatch" in result.err and "Traceback" not in result.err
    index = copy / "ckpt-1.index"
    index.write_bytes(index.read_bytes()[:-10])
    result = run_cli("ckpt", "inspect", index)
    assert result.code == 2 and "not a TensorFlow checkpoint index" in result.err
    shard.unlink()
    result = run_cli("ckpt", "inspect", copy / "ckpt-2")
    assert result.code == 2 and "missing data shard" in result.err
    empty = tmp_path / "empty_saved"
    empty.mkdir()
    (empty / "saved_model.pb").write_bytes(b"")
    result = run_cli("ckpt", "inspect", empty)
    assert result.code == 2 and "without variables" in result.err
