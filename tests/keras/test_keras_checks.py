"""K checks on Keras 3 ``fit``/``evaluate`` (torch backend), run in-process like the PyTorch fixtures.

The fixture contract (every buggy fixture in tests/fixtures/keras fires at its ``# expect`` line and
matches its snapshot ``keras/<fixture>.<CODE>.txt``; the correct programs stay silent) is checked
by the one conformance harness, ``tests/test_conformance.py`` (``test_keras_*``). Here: patches
are undone, ``--max-steps`` stops a ``fit``, ``evaluate`` is observed too, and the shared codes'
Keras rules on edge cases.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import FIXTURES, run_script

pytest.importorskip("keras")

KERAS_FIXTURES = FIXTURES / "keras"


def test_messages_state_the_evidence():
    report = run_script(KERAS_FIXTURES / "buggy_logits_without_from_logits.py", select=["K102"])
    (finding,) = report.by_code("K102")
    assert "sparse_categorical_crossentropy" in finding.message and "span [" in finding.message
    assert finding.evidence["pred_min"] < 0 < 1 < finding.evidence["pred_max"]
    report = run_script(KERAS_FIXTURES / "buggy_channels_first.py", select=["K108"])
    (finding,) = report.by_code("K108")
    assert "(32, 3, 16, 16)" in finding.message and "buggy_channels_first.py:14" in finding.message


def test_evaluate_is_observed(tmp_path):
    script = tmp_path / "evaluate_only.py"
    script.write_text(textwrap.dedent("""\
        import os
        os.environ.setdefault("KERAS_BACKEND", "torch")
        import keras
        import numpy as np
        keras.utils.set_random_seed(0)
        x = np.random.default_rng(0).normal(size=(32, 6)).astype("float32")
        y = keras.utils.to_categorical(np.arange(32) % 3, 3)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy")
        try:
            model.evaluate(x, y, verbose=0)
        except ValueError:
            pass
        """))
    report = run_script(script, select=["K103"])
    (finding,) = report.by_code("K103")
    assert finding.location.line == 11 and "one-hot" in finding.message


def test_max_steps_stops_fit():
    report = run_script(KERAS_FIXTURES / "correct_softmax_default_loss.py", max_steps=2)
    assert report.status == "stopped" and report.steps == 2


def test_patches_are_undone():
    import sys

    import keras
    from keras.src.layers.convolutional.base_conv import BaseConv

    owners = (keras.Model, keras.layers.Layer, keras.layers.BatchNormalization, BaseConv)
    before = [dict(vars(owner)) for owner in owners]
    finders = list(sys.meta_path)
    report = run_script(KERAS_FIXTURES / "buggy_bn_momentum.py")
    assert report.by_code("K104")
    assert [dict(vars(owner)) for owner in owners] == before
    assert list(sys.meta_path) == finders


# -- shared codes N101, L106, D105 -----------------------------------------------------------

def test_batch_losses_are_recovered_from_the_running_epoch_means():
    from nndoctor.keras.training_variants import batch_losses_from_means

    losses = [2.0, 1.0, 3.0, 0.5, 4.0]
    means = [(i, sum(losses[: i + 1]) / (i + 1)) for i in range(len(losses))]
    assert batch_losses_from_means(means) == pytest.approx(losses)
    # A new epoch restarts at batch 0; a gap (callbacks every few batches) drops the batch after it.
    assert batch_losses_from_means([(0, 1.0), (1, 2.0), (0, 5.0), (2, 4.0), (3, 4.5)]) == pytest.approx(
        [1.0, 3.0, 5.0, 6.0])


def test_ordered_batches_read_the_training_part_of_a_validation_split():
    import numpy as np

    from nndoctor.keras.data_variants import ordered_batches
    from nndoctor.tfdata.labels import ordered_evidence

    y = np.repeat(np.arange(4), 64)
    batches = ordered_batches(y, 32, 0.25)  # Keras keeps the first 192 samples for training
    assert len(batches) == 6 and {b[0] for b in batches} == {0, 1, 2}
    assert ordered_evidence(batches) == (6, 6, 3)
    one_hot = np.eye(4)[y]
    assert ordered_batches(one_hot, 32, 0.0) == ordered_batches(y, 32, 0.0)
    assert ordered_batches(np.linspace(0, 1, 256), 32, 0.0) is None  # regression targets
    assert ordered_evidence(ordered_batches(np.random.default_rng(0).permutation(y), 32, 0.0)) is None


def test_d105_stays_silent_when_fit_shuffles_sorted_data_with_a_validation_split(tmp_path):
    # validation_split takes the LAST samples before shuffling: on sorted data the validation set holds
    # only the last class. That is not D105 (the training batches are shuffled every epoch).
    script = tmp_path / "split_sorted.py"
    script.write_text(textwrap.dedent("""\
        import os
        os.environ.setdefault("KERAS_BACKEND", "torch")
        import keras
        import numpy as np
        keras.utils.set_random_seed(0)
        y = np.repeat(np.arange(4), 64)
        x = (np.random.default_rng(0).normal(size=(256, 8)) + y[:, None]).astype("float32")
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=32, epochs=1, validation_split=0.25, verbose=0)
        model.fit(x, y, batch_size=32, epochs=1, validation_split=0.25, shuffle=False, verbose=0)
        """))
    report = run_script(script, select=["D105"])
    (finding,) = report.by_code("D105")  # only the shuffle=False call, on its 192 training samples
    assert finding.location.line == 11 and "6 of 6 batches of 32 read over the epoch" in finding.message
    assert not report.internal_errors


def test_n101_layer_walk_changes_no_variable_and_no_random_state():
    import random

    import keras
    import numpy as np
    import torch

    from nndoctor.keras.nonfinite import first_nonfinite_layer

    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    hidden = keras.layers.Dropout(0.5)(hidden)
    hidden = keras.layers.Lambda(lambda t: keras.ops.sqrt(t - 1.0), name="sqrt_shift")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    x = np.random.default_rng(0).normal(size=(16, 6)).astype("float32")
    before = [keras.ops.convert_to_numpy(v.value).copy() for v in model.variables]
    states = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    found, samples = first_nonfinite_layer(model, x)
    assert (found.name, found.class_name, found.inputs_finite, found.weights_finite) == (
        "sqrt_shift", "Lambda", True, True)
    assert samples == 16
    assert all(np.array_equal(a, keras.ops.convert_to_numpy(v.value))
               for a, v in zip(before, model.variables, strict=True))
    assert torch.equal(states[0], torch.get_rng_state())
    assert np.array_equal(states[1], np.random.get_state()[1]) and states[2] == random.getstate()


def test_n101_message_names_the_layer_and_the_fit_line():
    report = run_script(KERAS_FIXTURES / "buggy_nan_loss_log_layer.py", select=["N101"])
    (finding,) = report.by_code("N101")
    assert "`log_counts` (Lambda)" in finding.message and "step 0 of fit" in finding.message
    assert finding.evidence["failing_batch"] is True and finding.evidence["layer_inputs_finite"] is True
    assert finding.location.line == 19


def test_d105_on_tfdata_counts_only_batches_followed_by_an_optimizer_step():
    from types import SimpleNamespace

    from nndoctor.tfdata.unshuffled import training_batches

    batches = [(0, 1.0, 16), (0, 1.0, 16), (1, 1.0, 16), (1, 1.0, 16)]
    trained = SimpleNamespace(label_batches=batches, label_steps=[0, 1, 2, 3])
    assert training_batches(trained, final_step=4) == batches
    validated = SimpleNamespace(label_batches=batches, label_steps=[5, 5, 5, 5])  # an eager evaluation loop
    assert training_batches(validated, final_step=5) == []


def test_d105_stays_silent_for_a_stateful_rnn(tmp_path):
    # A stateful RNN carries its state from batch to batch: shuffle=False is required there.
    script = tmp_path / "stateful.py"
    script.write_text(textwrap.dedent("""\
        import os
        os.environ.setdefault("KERAS_BACKEND", "torch")
        import keras
        import numpy as np
        keras.utils.set_random_seed(0)
        y = np.repeat(np.arange(2), 64)
        x = (np.random.default_rng(0).normal(size=(128, 5, 3)) + y[:, None, None]).astype("float32")
        model = keras.Sequential([keras.Input(batch_shape=(16, 5, 3)), keras.layers.LSTM(4, stateful=True),
                                  keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        """))
    report = run_script(script, select=["D105"])
    # (Keras 3.15's torch backend then fails in the stateful LSTM's backward by itself; D105 is decided
    # when fit starts.)
    assert not report.by_code("D105") and not report.internal_errors
    script.write_text(script.read_text().replace("stateful=True", "stateful=False"))
    assert run_script(script, select=["D105"]).by_code("D105")  # the same data, without the state: fires
