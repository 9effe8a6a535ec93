"""The TensorFlow bundle reader on a checked-in 1-KB checkpoint (fixtures/tf_small, written by
TensorFlow 2.21; fixtures/make_tf_small.py): no TensorFlow needed, so these run everywhere."""

from __future__ import annotations

import shutil

import numpy as np
from conftest import FIXTURES

from nndoctor.ckpt.tf_bundle import OBJECT_GRAPH_KEY, TensorBundle

TF_SMALL = FIXTURES / "tf_small"
KERNEL = "net/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"


def test_values_dtypes_and_object_graph():
    bundle = TensorBundle(str(TF_SMALL / "ckpt-1"))
    assert bundle.num_shards == 1
    assert np.array_equal(bundle.read(KERNEL), np.arange(12, dtype="float32").reshape(3, 4) / 8)
    bias = bundle.read("net/dense/bias/.ATTRIBUTES/VARIABLE_VALUE")
    assert np.isnan(bias[1]) and list(bias[[0, 2, 3]]) == [0.5, -1.0, 2.0]
    scale = bundle.read("net/scale/.ATTRIBUTES/VARIABLE_VALUE")
    assert bundle.entries["net/scale/.ATTRIBUTES/VARIABLE_VALUE"].dtype == "bfloat16"
    assert np.asarray(scale, dtype="float32").tolist() == [1.5, -2.0]
    (graph,) = bundle.read_strings(OBJECT_GRAPH_KEY)  # its checksum is verified too
    assert b"dense" in graph


def test_corrupted_shard_and_index_are_reported(run_cli, tmp_path):
    copy = tmp_path / "tf_small"
    shutil.copytree(TF_SMALL, copy)
    shard = copy / "ckpt-1.data-00000-of-00001"
    offset = TensorBundle(str(copy / "ckpt-1")).entries[KERNEL].offset
    data = bytearray(shard.read_bytes())
    data[offset] ^= 0x01
    shard.write_bytes(bytes(data))
    result = run_cli("ckpt", "inspect", copy)
    assert result.code == 2 and "checksum mismatch in tensor 'net/dense/kernel" in result.err
    (copy / "ckpt-1.index").write_bytes(b"\x00" * 100)
    result = run_cli("ckpt", "inspect", copy / "ckpt-1.index")
    assert result.code == 2 and "not a TensorFlow checkpoint index" in result.err
    assert "Traceback" not in result.err


def test_variables_are_named_by_object_path_and_given_roles():
    """A Keras 2 SavedModel's graph (as in public repos): layers, metric totals, an optimizer
    reaching the same kernel through its slots; names avoid the optimizer's paths."""
    from nndoctor.ckpt.tf_objects import GraphNode, name_variables

    suffix = "/.ATTRIBUTES/VARIABLE_VALUE"
    nodes = [
        GraphNode(children=[(1, "optimizer"), (2, "layer_with_weights-0"), (5, "keras_api")]),
        GraphNode(children=[(3, "dense/kernel"), (4, "iter")]),  # the optimizer: reaches the kernel first
        GraphNode(children=[(3, "kernel")]),
        GraphNode(variable=("dense/kernel", "layer_with_weights-0/kernel" + suffix)),
        GraphNode(variable=("RMSprop/iter", "optimizer/iter" + suffix)),
        GraphNode(children=[(6, "metrics")]),
        GraphNode(children=[(7, "0")]),
        GraphNode(children=[(8, "total")]),
        GraphNode(variable=("total", "keras_api/metrics/0/total" + suffix)),
    ]
    keys = {n.variable[1] for n in nodes if n.variable}
    named = {v.key.removesuffix(suffix): (v.name, v.role) for v in name_variables(nodes, keys)}
    assert named == {"layer_with_weights-0/kernel": ("layer_with_weights-0/kernel", "model"),
                     "optimizer/iter": ("RMSprop/iter", "optimizer"),
                     "keras_api/metrics/0/total": ("keras_api/metrics/0/total", "metric")}


def test_folder_without_state_file_names_its_prefixes(run_cli, tmp_path):
    copy = tmp_path / "tf_small"
    shutil.copytree(TF_SMALL, copy)
    (copy / "checkpoint").unlink()  # as tf.train.Checkpoint.write() leaves it
    result = run_cli("ckpt", "inspect", copy)
    assert result.code == 2 and f"name one by its prefix: {copy / 'ckpt-1'}" in result.err
    result = run_cli("ckpt", "inspect", copy / "ckpt-1")
    assert result.code == 1  # the prefix reads (C209: the planted NaN)
