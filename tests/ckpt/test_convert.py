"""convert: Keras weights -> PyTorch, verified by comparing outputs (< 1e-4 per layer type)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import FIXTURES, codes, sha256

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PAIRS = ["dense", "conv1d", "conv2d", "conv3d", "depthwise", "separable", "batchnorm",
         "layernorm", "embedding", "lstm", "gru"]
SPEC = str(FIXTURES / "keras_pairs.py")


@pytest.fixture(scope="module")
def pairs():
    # Imported once per module: Keras takes seconds to import.
    import keras_pairs

    return keras_pairs


def _independent_max_diff(pairs, name, out_path, torch_name=None):
    """Re-check the written file without nndoctor: load it, run both models, compare."""
    from safetensors.torch import load_file

    keras_model = getattr(pairs, f"keras_{name}")()
    torch_model = getattr(pairs, f"torch_{torch_name or name}")()
    torch_model.load_state_dict(load_file(out_path), strict=True)
    torch_model.eval()
    shape = [2] + [d or 5 for d in keras_model.inputs[0].shape[1:]]
    rng = np.random.default_rng(1)
    if name == "embedding":
        x = rng.integers(0, 11, size=shape)
    else:
        x = rng.standard_normal(shape).astype("float32")
    import keras

    expected = keras.ops.convert_to_numpy(keras_model(x, training=False))
    channels_first = name.startswith(("conv", "depthwise", "separable", "batchnorm", "cnn"))
    tx = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1) if channels_first else x))
    with torch.no_grad():
        got = torch_model(tx).numpy()
    if channels_first and got.ndim >= 3:
        got = np.moveaxis(got, 1, -1)
    return float(np.max(np.abs(got - expected)))


@pytest.mark.parametrize("name", PAIRS)
def test_each_layer_type_converts_within_tolerance(tmp_path, pairs, run_json, name):
    src = tmp_path / f"{name}.keras"
    getattr(pairs, f"keras_{name}")().save(src)
    before = sha256(src)
    out = tmp_path / f"{name}.safetensors"
    code, report, result = run_json("ckpt", "convert", src, "-o", out, "--model", f"{SPEC}:torch_{name}")
    assert code == 0, result.out
    verification = report["extra"]["convert"]["verification"]
    assert verification["max_abs_diff"] < 1e-4
    assert _independent_max_diff(pairs, name, out) < 1e-4
    assert sha256(src) == before


def test_weights_only_file_with_keras_model_and_flatten_reorder(tmp_path, pairs, run_json):
    src = tmp_path / "cnn.weights.h5"
    pairs.keras_cnn().save_weights(src)
    out = tmp_path / "cnn.safetensors"
    code, report, result = run_json("ckpt", "convert", src, "-o", out, "--model", f"{SPEC}:torch_cnn",
                                    "--keras-model", f"{SPEC}:keras_cnn")
    assert code == 0, result.out
    assert report["extra"]["convert"]["verification"]["max_abs_diff"] < 1e-4
    assert _independent_max_diff(pairs, "cnn", out) < 1e-4


def test_weights_only_without_keras_model_is_unverified(tmp_path, pairs, run_json):
    src = tmp_path / "dense.weights.h5"
    pairs.keras_dense().save_weights(src)
    out = tmp_path / "dense.safetensors"
    code, report, _ = run_json("ckpt", "convert", src, "-o", out, "--model", f"{SPEC}:torch_dense")
    assert codes(report) == ["C208"] and code == 0
    assert _independent_max_diff(pairs, "dense", out) < 1e-4


def test_legacy_h5_full_model(tmp_path, pairs, run_json):
    src = tmp_path / "cnn.h5"
    pairs.keras_cnn().save(src)
    out = tmp_path / "cnn.pt"
    code, report, result = run_json("ckpt", "convert", src, "-o", out, "--model", f"{SPEC}:torch_cnn")
    assert code == 0, result.out
    assert report["extra"]["convert"]["verification"]["max_abs_diff"] < 1e-4


def test_epsilon_mismatch_reported(tmp_path, pairs, run_json):
    src = tmp_path / "cnn.keras"
    pairs.keras_cnn().save(src)
    out = tmp_path / "cnn.safetensors"
    code, report, _ = run_json("ckpt", "convert", src, "-o", out, "--model", f"{SPEC}:torch_cnn_default_eps")
    c205 = next(f for f in report["findings"] if f["code"] == "C205")
    assert c205["evidence"]["keras_epsilon"] == pytest.approx(1e-3)
    assert c205["evidence"]["torch_eps"] == pytest.approx(1e-5)


def test_gru_reset_before_refused(tmp_path, pairs, run_json):
    src = tmp_path / "gru.keras"
    pairs.keras_gru_reset_before().save(src)
    out = tmp_path / "gru.safetensors"
    code, report, _ = run_json("ckpt", "convert", src, "-o", out, "--model", f"{SPEC}:torch_gru")
    assert code == 1 and not out.exists()
    c207 = next(f for f in report["findings"] if f["code"] == "C207")
    assert "reset_after=False" in c207["message"]


def test_leftover_keras_layers_refused(tmp_path, pairs, run_json):
    src = tmp_path / "dense.keras"
    pairs.keras_dense().save(src)
    out = tmp_path / "dense.safetensors"
    code, report, _ = run_json("ckpt", "convert", src, "-o", out, "--model", f"{SPEC}:torch_too_small")
    assert code == 1 and not out.exists()
    assert "C207" in codes(report)


def test_convert_refuses_pytorch_files(tmp_path, net, run_cli):
    src = tmp_path / "a.pt"
    torch.save(net.state_dict(), src)
    result = run_cli("ckpt", "convert", src, "-o", tmp_path / "b.pt", "--model", f"{SPEC}:torch_dense")
    assert result.code == 2 and "Keras files" in result.err


def test_weights_only_file_says_keras_epsilon_is_unknown(tmp_path, pairs, run_json):
    # Keras BatchNormalization at its default epsilon (1e-3); PyTorch BatchNorm1d at its own (1e-5).
    src = tmp_path / "bn.weights.h5"
    pairs.keras_bn_dense().save_weights(src)
    out = tmp_path / "bn.safetensors"
    code, report, _ = run_json("ckpt", "convert", src, "-o", out, "--model", f"{SPEC}:torch_bn_dense")
    assert codes(report) == ["C208"] and code == 0
    (c208,) = report["findings"]
    assert "Keras' BatchNormalization defaults to epsilon=0.001" in c208["message"]
    assert "PyTorch `1` uses eps=1e-05" in c208["message"]
    unknown = c208["evidence"]["epsilon_unknown"]["1"]
    assert unknown["torch_eps"] == pytest.approx(1e-5) and unknown["keras_default_epsilon"] == pytest.approx(1e-3)
    # From the stored moving variance v: max |sqrt((v + 1e-3) / (v + 1e-5)) - 1| (about 5e-4 at v = 1).
    variance = next(w for w in pairs.keras_bn_dense().weights if "moving_variance" in w.path)
    v = np.asarray(variance.numpy(), dtype=np.float64)
    assert unknown["relative_effect"] == pytest.approx(np.max(np.sqrt((v + 1e-3) / (v + 1e-5)) - 1), rel=1e-6)
    assert f"off by up to {unknown['relative_effect']:.1e} relatively" in c208["message"]
    assert "build `1` with eps=0.001" in c208["fix"]
    # What the note warns about is real: the outputs drift; built as the fix says, they do not.
    assert _independent_max_diff(pairs, "bn_dense", out) > 1e-4
    out_fixed = tmp_path / "bn_fixed.safetensors"
    code, report, _ = run_json("ckpt", "convert", src, "-o", out_fixed, "--model", f"{SPEC}:torch_bn_dense_keras_eps")
    (c208,) = report["findings"]
    assert "epsilon" not in c208["message"] and "epsilon_unknown" not in (c208["evidence"] or {})
    assert _independent_max_diff(pairs, "bn_dense", out_fixed, torch_name="bn_dense_keras_eps") < 1e-5
