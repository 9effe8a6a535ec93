"""TensorFlow/Keras explanations from text alone: the shape words of E134, the label causes of
E117, the GradientTape source analysis and the TFRecord verdict of E135, the variant mechanism
(one catalog entry per code), and V104 not claiming an unrelated error that follows TensorFlow's
start-up warnings. No TensorFlow import: these are pure functions of text and numbers."""

from __future__ import annotations

import textwrap

import pytest

from nndoctor.commands.explain.base import explanations, variants_of
from nndoctor.commands.explain.cli import explain_text
from nndoctor.commands.explain.keras_input import axis_mismatch, rank_mismatch, shape_mismatch
from nndoctor.commands.explain.tape_source import analyse
from nndoctor.commands.explain.tf_errors import tf_label_cause
from nndoctor.commands.explain.tf_gradients import variable_names_from_message
from nndoctor.commands.explain.tf_text import layer_from_node, parse_shape
from nndoctor.commands.explain.tfrecord_parse import verdict
from nndoctor.core.registry import get_check


@pytest.mark.parametrize("expected, found, words", [
    ([None, 28, 28, 1], [None, 1, 28, 28], "channels-first"),
    ([None, 3, 32, 32], [None, 32, 32, 3], "channels-last"),
    ([None, 96, 96, 3], [None, 384, 384, 3], "384×384 and the model was built for 96×96"),
    ([None, None, None, 3], [1, 499, 552, 4], "RGBA"),
    ([None, 64, 64, 3], [None, 64, 64, 1], "grayscale"),
    ([None, 20, 1], [None, 100, 2], "timesteps 100 instead of 20, features 2 instead of 1"),
    ([32, 10], [16, 10], "fixed batch size of 32"),
    ([None, 28, 28, 1], [None, 28, 28], "no channel axis"),
])
def test_shape_mismatch_in_words(expected, found, words):
    cause, fix = shape_mismatch(expected, found)
    assert words in cause, cause
    assert fix


def test_rank_mismatch_tells_a_single_image_from_grayscale_batches():
    single, fix = rank_mismatch(4, [224, 224, 3], 3)
    assert "without the batch axis" in single and "x[None]" in fix
    gray, fix = rank_mismatch(4, [None, 28, 28], 3)
    assert "no channel axis" in gray and "expand_dims(x, -1)" in fix
    sequence, _ = rank_mismatch(3, [None, 100], 2)
    assert "features axis" in sequence


def test_axis_mismatch_flattening_and_columns():
    cause, fix = axis_mismatch(-1, 784, [None, 28, 28], "dense")
    assert "not flattened: 28×28 = 784" in cause and "Flatten()" in fix
    cause, _ = axis_mismatch(-1, 180, [32, 245], "dense_30")
    assert "built for 180 features" in cause and "has 245" in cause
    cause, _ = axis_mismatch(-1, 3, [8, 3, 64, 64], "conv2d")
    assert "channels-first" in cause


@pytest.mark.parametrize("label, classes, values, words", [
    (3, 3, [1, 2, 3, 1], "1-based"),
    (-1, 80, [], "has no ignore index"),
    (26, 4, [21, 2, 26], "labels go up to 26"),
    (66908, 66908, [49662, 66908], "one class short"),
])
def test_tf_label_causes(label, classes, values, words):
    cause, fix = tf_label_cause(label, classes, values)
    assert words in cause and fix


def test_text_helpers():
    assert parse_shape("(None, 28, 28, 1)") == [None, 28, 28, 1]
    assert parse_shape("[4,8]") == [4, 8]
    assert layer_from_node("sequential_2/conv2d_2/Conv2D") == "sequential_2/conv2d_2"
    assert layer_from_node("SparseSoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits") is None
    assert variable_names_from_message(
        "No gradients provided for any variable: (['a/kernel:0', 'a/bias:0'],). Provided") == ["a/kernel:0", "a/bias:0"]


def _loop(body: str) -> str:
    return textwrap.dedent("""\
        import numpy as np
        import tensorflow as tf
        def step(model, other, x, y, optimizer, loss_fn):
        """) + textwrap.indent(textwrap.dedent(body), "    ")


def test_tape_analysis_finds_the_cut():
    numpy = _loop("""\
        with tf.GradientTape() as tape:
            logits = model(x)
            loss = loss_fn(y, logits.numpy())
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        """)
    facts = analyse(numpy, 8)
    assert facts.blockers and facts.blockers[0][1] == "logits.numpy()" and facts.blockers[0][2] == "numpy"
    outside = _loop("""\
        with tf.GradientTape() as tape:
            logits = model(x)
        loss = loss_fn(y, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        """)
    assert analyse(outside, 8).target_outside_tape == 6
    argmax = _loop("""\
        with tf.GradientTape() as tape:
            predicted = tf.cast(tf.argmax(model(x), axis=1), tf.float32)
            loss = tf.reduce_mean(tf.square(predicted - y))
        grads = tape.gradient(loss, model.trainable_variables)
        """)
    assert analyse(argmax, 7).blockers[0][2] == "no-gradient"
    unused = _loop("""\
        with tf.GradientTape() as tape:
            logits = other(x)
            loss = loss_fn(y, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        """)
    assert analyse(unused, 7).model_unused == "model"


def test_tape_analysis_is_silent_on_a_correct_loop():
    correct = _loop("""\
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
            loss += sum(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        print(float(loss), np.mean(grads[0]))
        """)
    facts = analyse(correct, 9)
    assert facts is not None and facts.blockers == [] and facts.target_outside_tape is None
    assert facts.model_unused is None


def _profile(lengths, kinds=None, missing=0, total=10):
    return {"records": total, "kinds": kinds or {"float": total - missing}, "lengths": lengths, "missing": missing,
            "missing_records": ["a.tfrecord#1"] if missing else [],
            "length_records": {str(n): [f"a.tfrecord#{n}"] for n in lengths}}


def test_tfrecord_verdict_spec_or_data():
    cause, fix = verdict("bbox", _profile({3: 10}), 4, "float")
    assert "every record holds 3 values" in cause and "FixedLenFeature([3]" in fix
    cause, _ = verdict("bbox", _profile({4: 8, 8: 2}), 4, "float")
    assert "inconsistent (F202)" in cause and "2 with 8" in cause
    cause, _ = verdict("label", _profile({1: 10}, kinds={"float": 10}), 1, "int64")
    assert "as a float list and the spec parses it as int64" in cause
    cause, _ = verdict("y", _profile({}, missing=10), None, "int64")
    assert "no record has a feature 'y'" in cause


def test_variants_share_their_owners_catalog_entry():
    for code in ("E105", "E108", "E117"):
        owner = get_check(code)
        (variant,) = variants_of(code)
        assert variant.name == owner.name
        assert variant.doc_sections()["What it does"].split()[0] == "TensorFlow:" or "TensorFlow" in variant.doc_sections()["What it does"]
        assert variant.doc_sections()["What it does"] in owner.documentation()
    assert all(e.code != "E108" for e in explanations(ignore=["E108"]))
    assert any(e.code == "E108" and e is not get_check("E108") for e in explanations(select=["E108"]))


def test_new_codes_document_the_fixed_headings():
    for code in ("E133", "E134", "E135"):
        sections = get_check(code).doc_sections()
        assert list(sections) == ["What it does", "Why is this bad?", "Example", "Use instead", "References"]
        assert "https://" in sections["References"]


def test_library_warnings_do_not_claim_an_unrelated_error():
    # Synthetic (the format of TensorFlow 2.x start-up lines): harmless TensorRT warnings, then a
    # Keras shape error. The shape error is the cause; the warning is not.
    log = textwrap.dedent("""\
        2021-05-01 10:00:00.000000: W tensorflow/stream_executor/platform/default/dso_loader.cc:64] Could not load dynamic library 'libnvinfer.so.7'; dlerror: libnvinfer.so.7: cannot open shared object file: No such file or directory
        Traceback (most recent call last):
          File "train.py", line 12, in <module>
            model.fit(x, y)
        ValueError: Input 0 of layer "sequential" is incompatible with the layer: expected shape=(None, 28, 28, 1), found shape=(None, 28, 28)
        """)
    findings, unexplained = explain_text(log)
    assert [f.code for f in findings] == ["E134"] and not unexplained
    assert findings[0].location.path == "train.py" and findings[0].location.line == 12
