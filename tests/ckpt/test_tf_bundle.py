"""The TensorFlow bundle reader on a checked-in 1-KB checkpoint (fixtures/tf_small, written by
TensorFlow 2.21; fixtures/make_tf_small.py): no TensorFlow needed, so these run everywhere."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import FIXTURES

from nndoctor.commands.ckpt.tf_bundle import OBJECT_GRAPH_KEY, TensorBundle, masked_crc32c

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
    from nndoctor.commands.ckpt.tf_objects import GraphNode, name_variables

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


# -- real files from TensorFlow Serving's test data (fixtures/TF_SERVING_FILES.md) -------------
SERVING = FIXTURES / "tf_serving_half_plus_two"


def test_snappy_blocks():
    from nndoctor.commands.ckpt.snappy_block import SnappyError, decompress

    # varint 8; literal "ab"; a copy of 6 bytes at offset 2 that overlaps its own output
    assert decompress(b"\x08\x04ab\x09\x02", 100) == b"abababab"
    # a 2-byte-offset copy and a literal whose length takes one extra byte (tag 60)
    literal = bytes(range(70))
    assert decompress(bytes([76, 60 << 2, 69]) + literal + bytes([(6 - 1) << 2 | 2, 70, 0]), 100) == literal + literal[:6]
    for bad in (b"\x08\x04ab\x09\x05", b"\x08\x04ab", b"\x09\x04ab\x09\x02\x00", b"\xff\xff\xff\xff\xff\xff"):
        with pytest.raises(SnappyError):
            decompress(bad, 100)
    with pytest.raises(SnappyError, match="more than 100"):
        decompress(b"\xc8\x01\x00a", 100)


def test_tensorflow_1_savedmodel_with_a_snappy_index(run_cli, tmp_path):
    """TF Serving's half_plus_two, written by TensorFlow 1.x: its index blocks are Snappy-compressed."""
    bundle = TensorBundle(str(SERVING / "00000123" / "variables" / "variables"))
    values = {key: bundle.read(key).item() for key in bundle.entries}
    assert values == {"a": 0.5, "a2": 0.5, "b": 2.0, "c": 3.0, "c2": 3.0}  # what TensorFlow reads
    result = run_cli("ckpt", "inspect", SERVING / "00000123")
    assert result.code == 0 and "tf-savedmodel" in result.out
    assert "(root): 5 tensors, 5 values, float32" in result.out
    # the model folder TF Serving is given: numbered versions
    result = run_cli("ckpt", "inspect", SERVING)
    assert result.code == 2
    assert f"a TensorFlow Serving model folder (SavedModel versions 00000123); name one version: {SERVING / '00000123'}" in result.err
    # a damaged compressed block is reported, not raised
    copy = tmp_path / "half"
    shutil.copytree(SERVING / "00000123", copy)
    index = copy / "variables" / "variables.index"
    data = bytearray(index.read_bytes())
    data[1] = 0x7F  # the first block's literal tag: a literal longer than the block
    index.write_bytes(bytes(data))
    result = run_cli("ckpt", "inspect", copy)
    assert result.code == 2 and "checksum mismatch in the block at 0" in result.err  # as TensorFlow says
    # the same damage under a valid checksum reaches the decompressor, which refuses it
    length = _first_block_length(bytes(data))
    data[length + 1:length + 5] = masked_crc32c(bytes(data[:length + 1])).to_bytes(4, "little")
    index.write_bytes(bytes(data))
    result = run_cli("ckpt", "inspect", copy)
    assert result.code == 2 and "Snappy-compressed block at 0 is corrupt" in result.err
    assert "Traceback" not in result.err


def _first_block_length(index: bytes) -> int:
    """The length of the data block at offset 0, from the handle in the table's index block."""
    from nndoctor.util.protowire import read_varint

    footer = index[-48:]
    _, pos = read_varint(footer, 0)
    _, pos = read_varint(footer, pos)
    index_offset, pos = read_varint(footer, pos)
    entry = index[index_offset:]
    shared, at = read_varint(entry, 0)
    unshared, at = read_varint(entry, at)
    _value_length, at = read_varint(entry, at)
    offset, at = read_varint(entry, at + unshared)
    assert (shared, offset) == (0, 0)
    return read_varint(entry, at)[0]


def test_v1_checkpoint_and_a_state_file_naming_another_machine(run_cli, tmp_path):
    v1 = FIXTURES / "tf_serving_bad_half_plus_two"
    result = run_cli("ckpt", "inspect", v1)
    assert result.code == 2
    assert ("checkpoint names '/tmp/bad_half_plus_two/00000123/export', a V1 checkpoint (one file, no .index"
            in result.err)
    result = run_cli("ckpt", "inspect", v1 / "export")
    assert result.code == 2 and "export: a V1 checkpoint" in result.err
    # a folder copied from where it was written: the state file's absolute path is stale
    moved = tmp_path / "copied_run"
    shutil.copytree(TF_SMALL, moved)
    (moved / "checkpoint").write_text('model_checkpoint_path: "/cluster/job7/run/ckpt-1"\n')
    result = run_cli("ckpt", "inspect", moved, "--json", tmp_path / "moved.json")
    assert result.code == 1  # read: C209 on the planted NaN
    metadata = json.loads((tmp_path / "moved.json").read_text())["extra"]["checkpoint"]["metadata"]
    assert metadata["prefix"] == str(moved / "ckpt-1")
    assert metadata["state_file"] == "the state file names '/cluster/job7/run/ckpt-1', not found there; read the same name beside it"
