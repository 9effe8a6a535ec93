"""The K rules on hand-made batch facts: fast, no Keras run (edges the fixtures do not cover)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from nndoctor.core.engine import Session
from nndoctor.keras import facts as kf
from nndoctor.keras.checks import (
    DataFormatMismatch,
    LabelEncodingMismatch,
    LogitsWithoutFromLogits,
    SoftmaxWithFromLogits,
)
from nndoctor.keras.events import KerasBatch


def batch(*, loss=None, activation=None, x=None, y=None, pred=None, conv=None) -> kf.BatchFacts:
    return kf.BatchFacts(
        phase="fit", call_location=None, compile_location=None, loss=loss, output_layer="head",
        output_activation=activation, output_location=None, x=kf.summarize(x), y=kf.summarize(y),
        y_pred=kf.summarize(pred), first_conv=conv)


def fired(check_cls, facts: kf.BatchFacts) -> bool:
    session = Session(checks=[check_cls])
    session.emit(KerasBatch(facts=facts))
    return bool(session.report.by_code(check_cls.code))


SPARSE = kf.LossConfig("sparse_categorical_crossentropy", "sparse", False)
SPARSE_LOGITS = kf.LossConfig("SparseCategoricalCrossentropy", "sparse", True)
CATEGORICAL = kf.LossConfig("categorical_crossentropy", "categorical", False)
rng = np.random.default_rng(0)
LOGITS = rng.normal(size=(16, 4)) * 3
PROBS = np.exp(LOGITS) / np.exp(LOGITS).sum(axis=1, keepdims=True)


def test_loss_config_reads_strings_functions_partials_and_objects():
    assert kf.loss_config("sparse_categorical_crossentropy") == SPARSE
    assert kf.loss_config("mse").kind is None
    assert kf.loss_config(None) is None and kf.loss_config(["mse", "mse"]) is None

    def categorical_crossentropy(y, p, from_logits=False):
        return y

    assert kf.loss_config(categorical_crossentropy) == CATEGORICAL
    partial = kf.loss_config(functools.partial(categorical_crossentropy, from_logits=True))
    assert partial.kind == "categorical" and partial.from_logits
    keras = pytest.importorskip("keras")
    assert kf.loss_config(keras.losses.SparseCategoricalCrossentropy(from_logits=True)) == SPARSE_LOGITS
    assert kf.loss_config(keras.losses.BinaryCrossentropy()).kind == "binary"


def test_k101_needs_from_logits_and_probabilities():
    assert fired(SoftmaxWithFromLogits, batch(loss=SPARSE_LOGITS, pred=PROBS))
    assert not fired(SoftmaxWithFromLogits, batch(loss=SPARSE_LOGITS, pred=LOGITS, activation="linear"))
    assert not fired(SoftmaxWithFromLogits, batch(loss=SPARSE, pred=PROBS, activation="softmax"))


def test_k102_needs_values_outside_unit_interval_and_no_squashing_head():
    assert fired(LogitsWithoutFromLogits, batch(loss=SPARSE, pred=LOGITS, activation="linear"))
    assert not fired(LogitsWithoutFromLogits, batch(loss=SPARSE, pred=PROBS, activation="softmax"))
    assert not fired(LogitsWithoutFromLogits, batch(loss=SPARSE_LOGITS, pred=LOGITS))
    assert not fired(LogitsWithoutFromLogits, batch(loss=kf.LossConfig("mse", None, False), pred=LOGITS))


def test_k103_encodings():
    ids = rng.integers(0, 4, size=(16,))
    one_hot = np.eye(4)[ids]
    assert fired(LabelEncodingMismatch, batch(loss=SPARSE, y=one_hot, pred=PROBS))
    assert fired(LabelEncodingMismatch, batch(loss=CATEGORICAL, y=ids[:, None] * 0 + 3, pred=PROBS))
    assert not fired(LabelEncodingMismatch, batch(loss=SPARSE, y=ids, pred=PROBS))
    assert not fired(LabelEncodingMismatch, batch(loss=CATEGORICAL, y=one_hot, pred=PROBS))
    soft = one_hot * 0.9 + 0.025  # label smoothing: not integer ids, not one-hot
    assert not fired(LabelEncodingMismatch, batch(loss=CATEGORICAL, y=soft, pred=PROBS))
    assert not fired(LabelEncodingMismatch, batch(loss=SPARSE, y=soft, pred=PROBS))


def test_k108_layouts_and_small_feature_maps():
    last = kf.ConvFacts("conv", "channels_last", 32, None)
    assert fired(DataFormatMismatch, batch(x=np.zeros((2, 3, 32, 32)), conv=last))
    assert not fired(DataFormatMismatch, batch(x=np.zeros((2, 32, 32, 3)), conv=kf.ConvFacts("c", "channels_last", 3, None)))
    first = kf.ConvFacts("conv", "channels_first", 32, None)
    assert fired(DataFormatMismatch, batch(x=np.zeros((2, 32, 32, 3)), conv=first))
    board = kf.ConvFacts("conv", "channels_last", 16, None)  # 2048: 4x4 board, 16 one-hot planes
    assert not fired(DataFormatMismatch, batch(x=np.zeros((2, 4, 4, 16)), conv=board))
