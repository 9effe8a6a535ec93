"""Unit tests of the D1xx detection functions (no training loop) and a few end-to-end edges."""

from __future__ import annotations

import pytest
import torch

from nndoctor.checks import inputs as d
from nndoctor.instrument.inputs_probe import class_target_range, summarize_samples
from nndoctor.instrument.stats import summarize

IMAGENET_MEAN = torch.tensor(d.IMAGENET_MEAN).view(1, 3, 1, 1)
IMAGENET_STD = torch.tensor(d.IMAGENET_STD).view(1, 3, 1, 1)


def test_image_layout():
    assert d.image_layout((8, 3, 32, 32)) == "nchw"
    assert d.image_layout((8, 32, 32, 3)) == "nhwc"
    assert d.image_layout((8, 64)) is None
    assert d.image_layout((8, 16, 4, 4)) is None  # feature maps, not images


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (torch.randint(0, 256, (4, 3, 16, 16)).float(), "0–255 pixels"),
        (torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8), "uint8 pixels"),
        (torch.randint(0, 4096, (4, 1, 16, 16)).float(), "raw sensor/16-bit values"),
        (torch.rand(4, 3, 16, 16), None),
        ((torch.rand(4, 3, 16, 16) - IMAGENET_MEAN) / IMAGENET_STD, None),
    ],
)
def test_unnormalized_pixels(x, expected):
    s = summarize(x)
    assert d.unnormalized_pixels(s.dtype, s.min, s.max) == expected


def _norm_kind(x):
    s = summarize(x)
    return d.normalization_mismatch(s.min, s.max, s.channel_mean_dim1, s.channel_std_dim1)


def test_normalization_mismatch_signatures():
    torch.manual_seed(0)
    pixels255 = torch.randint(0, 256, (8, 3, 16, 16)).float()
    pixels01 = pixels255 / 255
    caffe_mean = torch.tensor([123.675, 116.28, 103.53]).view(1, 3, 1, 1)
    caffe_std = torch.tensor([58.395, 57.12, 57.375]).view(1, 3, 1, 1)
    assert _norm_kind((pixels255 - IMAGENET_MEAN) / IMAGENET_STD) == "unit-stats-on-255-pixels"
    assert _norm_kind((pixels01 - caffe_mean) / caffe_std) == "255-stats-on-unit-pixels"
    assert _norm_kind(pixels01 - caffe_mean) == "255-stats-on-unit-pixels"  # Caffe std=1
    # correct pipelines
    assert _norm_kind((pixels01 - IMAGENET_MEAN) / IMAGENET_STD) is None
    assert _norm_kind((pixels255 - caffe_mean) / caffe_std) is None
    assert _norm_kind(pixels255 - caffe_mean) is None  # Caffe-style x - mean on 0..255
    assert _norm_kind(pixels01 * 2 - 1) is None
    # a dark but correctly normalised batch is negative yet keeps its contrast
    dark = (pixels01 * 0.2 - IMAGENET_MEAN) / IMAGENET_STD
    assert dark.max() < 0 and _norm_kind(dark) is None


def test_unit_rgb_means_inverts_each_scale():
    rgb = (0.6, 0.5, 0.3)
    assert d.unit_rgb_means(rgb, 0.0, 1.0) == rgb
    assert d.unit_rgb_means(tuple(v * 255 for v in rgb), 0.0, 255.0) == pytest.approx(rgb)
    assert d.unit_rgb_means(tuple(v * 2 - 1 for v in rgb), -1.0, 1.0) == pytest.approx(rgb)
    standardised = tuple((v - m) / s for v, m, s in zip(rgb, d.IMAGENET_MEAN, d.IMAGENET_STD))
    assert d.unit_rgb_means(standardised, -2.0, 2.5) == pytest.approx(rgb)
    assert d.unit_rgb_means((0.1, 0.2), 0, 1) is None
    # 0–1 statistics on 0–255 pixels (D102's): on no known scale, no colour reading (no D103)
    assert d.unit_rgb_means((557.5, 566.2, 558.3), -2.118, 1136.0) is None


def test_channel_order_decision_needs_enough_batches_and_a_clear_mean():
    assert not d.channel_order_swapped([-0.2] * (d.CHANNEL_ORDER_MIN_BATCHES - 1))
    assert d.channel_order_swapped([-0.2] * d.CHANNEL_ORDER_MIN_BATCHES)
    assert not d.channel_order_swapped([0.0] * 20)  # gray data
    mixed = [0.05, -0.1] * (d.CHANNEL_ORDER_MIN_BATCHES // 2)
    assert not d.channel_order_swapped(mixed)
    assert d.red_minus_blue((0.6, 0.5, 0.3)) == pytest.approx(0.3)


def test_channels_last_into_conv():
    nhwc = (16, 32, 32, 3)
    assert d.channels_last_into_conv(nhwc, nhwc, 32)
    assert not d.channels_last_into_conv(nhwc, (16, 3, 32, 32), 3)  # permuted by the model
    assert not d.channels_last_into_conv((16, 3, 32, 32), (16, 3, 32, 32), 3)
    assert not d.channels_last_into_conv(nhwc, None, None)


def test_unshuffled_evidence():
    sorted_batches = [(0, 1.0, 16), (0, 1.0, 16), (1, 1.0, 16), (1, 1.0, 16)]
    assert d.unshuffled_evidence(sorted_batches) == (4, 2)
    imbalanced = [(0, 1.0, 16)] * 6  # one class dominates everywhere: not sorted
    assert d.unshuffled_evidence(imbalanced) is None
    shuffled = [(0, 0.4, 16), (2, 0.35, 16), (1, 0.45, 16), (3, 0.3, 16)]
    assert d.unshuffled_evidence(shuffled) is None
    assert d.unshuffled_evidence(sorted_batches[:3]) is None  # too few
    tiny = [(0, 1.0, 2), (1, 1.0, 2), (0, 1.0, 2), (1, 1.0, 2)]
    assert d.unshuffled_evidence(tiny) is None  # batches too small to mean anything
    assert d.chance_of_single_class_batch(2, 8) == pytest.approx(2 / 256)


def test_dominant_fraction_and_label_tensor():
    assert d.dominant_fraction([1, 1, 1, 2]) == (1, 0.75)
    y = torch.tensor([0, 1, 2])
    assert d.label_tensor((torch.zeros(3, 2), y)) is y
    assert d.label_tensor({"image": torch.zeros(3, 2), "label": y}) is y
    assert d.label_tensor((torch.zeros(3, 2), torch.rand(3))) is None  # regression targets


def test_class_target_range_excludes_ignore_index():
    logits = torch.zeros(4, 5)
    assert class_target_range(logits, torch.tensor([1, 2, 3, 5]), -100) == (5, 1, 5, 1, 4)
    assert class_target_range(logits, torch.tensor([0, -1, 4, -1]), -1) == (5, 0, 4, 0, 4)
    assert class_target_range(logits, torch.tensor([0, -1, 4, 2]), -100)[3] == 1
    assert class_target_range(logits, torch.rand(4, 5), -100) is None  # probability targets
    assert class_target_range(logits, torch.tensor([-100, -100]), -100) is None
    # segmentation: (N, C, H, W) logits, (N, H, W) targets
    assert class_target_range(torch.zeros(2, 3, 4, 4), torch.full((2, 4, 4), 3), -100)[3] == 32


def test_binary_target_outside_unit():
    assert d.binary_target_outside_unit(0.0, 255.0)
    assert d.binary_target_outside_unit(-1.0, 1.0)
    assert not d.binary_target_outside_unit(0.0, 1.0)


def test_sample_summary_constant_samples_and_fingerprints():
    torch.manual_seed(0)
    x = torch.rand(6, 3, 8, 8)
    x[2] = 0
    x[4] = x[1]
    s = summarize_samples(x)
    assert s.constant == (False, False, True, False, False, False)
    assert s.fingerprints[4] == s.fingerprints[1]
    assert len(set(s.fingerprints)) == 5
    assert s.values_per_sample == 192
    # shared background: samples that differ only off the strided grid are still told
    # apart by their full-sample sums
    y = torch.zeros(2, 1, 64, 64)
    y[0, 0, 1, 1], y[1, 0, 1, 2] = 1.0, 2.0
    a, b = summarize_samples(y).fingerprints
    assert a != b


def test_sample_fingerprints_are_the_per_row_hashes():
    """The batch-wide conversion gives the bytes the row-by-row one gave (a fingerprint is
    blake2b over the float16 values picked and the sums written with 6 significant digits)."""
    import hashlib

    import numpy as np

    from nndoctor.instrument.inputs_probe import FINGERPRINT_VALUES

    torch.manual_seed(1)
    x = torch.randn(5, 3, 20, 20) * torch.tensor([1.0, 1e-8, 1e6, 3.0, 7.0]).view(5, 1, 1, 1)
    x[3, 0, 0, 0] = float("inf")
    flat = x.reshape(5, -1)
    index = torch.linspace(0, flat.shape[1] - 1, FINGERPRINT_VALUES).long()
    picked = flat.index_select(1, index).numpy()
    sums = torch.stack([flat.double().sum(1), (flat.double() ** 2).sum(1)], 1).float().numpy()
    with np.errstate(over="ignore"):  # 1e6 is beyond float16: inf, in both
        expected = tuple(hashlib.blake2b(picked[i].astype("float16").tobytes()
                                         + f"{sums[i, 0]:.6g},{sums[i, 1]:.6g}".encode(), digest_size=16).digest()
                         for i in range(5))
    assert summarize_samples(x).fingerprints == expected


def test_sample_summary_rejects_non_float():
    assert summarize_samples(torch.zeros(4, 3, dtype=torch.long)) is None


def _unit_stats_match(x):
    low, high = x.amin(dim=(0, 2, 3)).tolist(), x.amax(dim=(0, 2, 3)).tolist()
    return d.unit_stats_on_255_pixels(low, high, d.backmapped_integer_offsets(x, "nchw"), float(x.max()))


def test_unit_stats_on_255_pixels_names_the_constants_it_matches():
    torch.manual_seed(0)
    no_black = torch.randint(16, 236, (8, 3, 16, 16)).float()  # all values positive after (x - m) / s
    found = _unit_stats_match((no_black - IMAGENET_MEAN) / IMAGENET_STD)
    assert found.name == "ImageNet" and found.integral and 200 < found.pixel_max <= 235.5
    clip_mean = torch.tensor(d.UNIT_SCALE_STATISTICS[1][1]).view(1, 3, 1, 1)
    clip_std = torch.tensor(d.UNIT_SCALE_STATISTICS[1][2]).view(1, 3, 1, 1)
    assert _unit_stats_match((no_black - clip_mean) / clip_std).name == "CLIP"
    # resampled (non-integer) pixels: accepted on the range alone, above 255 only
    smooth = torch.nn.functional.interpolate(no_black, scale_factor=1.5, mode="bilinear")
    found = _unit_stats_match((smooth - IMAGENET_MEAN) / IMAGENET_STD)
    assert found is not None and not found.integral


def test_unit_stats_on_255_pixels_leaves_raw_and_correct_inputs_alone():
    torch.manual_seed(0)
    pixels = torch.randint(0, 256, (8, 3, 16, 16)).float()
    assert _unit_stats_match(pixels) is None  # raw 0..255: D101's
    assert _unit_stats_match(torch.randint(0, 4096, (8, 3, 16, 16)).float()) is None  # 12-bit sensor data
    assert _unit_stats_match((pixels / 255 - IMAGENET_MEAN) / IMAGENET_STD) is None  # correct
    assert _unit_stats_match(pixels * 0.8 + 10.3) is None  # fractional values within 0..255


def test_label_order_judges_the_whole_run_in_constant_memory():
    sorted_run = d.LabelOrder()
    for label in (0, 1):
        for _ in range(300):
            sorted_run.add((label, 1.0, 16))
            if label == 0:
                assert sorted_run.evidence() is None  # one label so far: could be imbalance
    assert sorted_run.evidence() == (600, 2) and sorted_run.longest == (0, 300)
    assert len(sorted_run.first) == 8 and len(sorted_run.last) == 8
    # Shuffled, heavily imbalanced (97% / 3%): mostly single-class batches, all of the same label.
    generator = torch.Generator().manual_seed(0)
    imbalanced = d.LabelOrder()
    for _ in range(2000):
        batch = (torch.rand(16, generator=generator) < 0.03).long()
        imbalanced.add(d.batch_label_summary(batch))
    assert imbalanced.single > 0.6 * imbalanced.usable and imbalanced.evidence() is None
    # Shuffled balanced classes: single-class batches are rare.
    balanced = d.LabelOrder()
    for _ in range(2000):
        balanced.add(d.batch_label_summary(torch.randint(0, 2, (8,), generator=generator)))
    assert balanced.evidence() is None


def test_label_order_settles_on_a_shuffled_loader_and_never_on_a_sorted_one():
    generator = torch.Generator().manual_seed(0)
    shuffled = d.LabelOrder()
    for i in range(d.LabelOrder.SETTLE_BATCHES):
        assert not shuffled.settled, i
        shuffled.add(d.batch_label_summary(torch.randint(0, 10, (32,), generator=generator)))
    assert shuffled.settled
    sorted_run = d.LabelOrder()
    for label in range(3):
        for _ in range(200):
            sorted_run.add((label, 1.0, 32))
    assert not sorted_run.settled and sorted_run.evidence() is not None
    # Imbalanced (mostly single-class batches of one label): not settled, still read every batch.
    imbalanced = d.LabelOrder()
    for _ in range(400):
        imbalanced.add(d.batch_label_summary((torch.rand(16, generator=generator) < 0.03).long()))
    assert not imbalanced.settled


def test_d105_reads_a_settled_loaders_labels_on_sampled_steps_only(monkeypatch):
    """Labels on the CPU are counted on every batch (~10 µs) until the loader has shown
    hundreds of shuffled batches; then only on sampled steps (the handlers leave the usual
    step), and a sorted loader started after it is read on every batch again and reported."""
    from torch.utils.data import DataLoader, TensorDataset

    from nndoctor.core.engine import Session
    from nndoctor.instrument.extensions import install
    from nndoctor.run.end import finish

    counted = []
    original = d.batch_label_summary
    monkeypatch.setattr(d, "batch_label_summary", lambda labels: counted.append(1) or original(labels))
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32 * 500, 4), torch.arange(32 * 500) % 10)
    model = torch.nn.Linear(4, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    session = Session(select=["D105"], sample_every=100, sample_budget=0)
    installation = install(session)
    try:
        shuffled = DataLoader(data, batch_size=32, shuffle=True)
        for x, y in shuffled:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        shuffled_reads = len(counted)
        check = next(c for c in session.checks if c.code == "D105")
        # Settled, and no other loader to read on every batch: no call on the usual batch.
        assert all(s is not check for s, _ in session._every_step.get("batch", ()))
        assert any(s is check for s, _ in session._handlers["batch"])
        sorted_data = TensorDataset(torch.randn(32 * 300, 4), torch.arange(32 * 300) // (32 * 100))
        in_order = DataLoader(sorted_data, batch_size=32)
        for x, y in in_order:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    finally:
        finish(session, installation, "completed", None)
    # 500 batches: every one of the first 256, then the sampled ones (steps 300 and 400).
    assert shuffled_reads == d.LabelOrder.SETTLE_BATCHES + 2
    assert [f.code for f in session.report.findings] == ["D105"]


def test_batch_label_summary_skips_negative_labels():
    assert d.batch_label_summary(torch.tensor([3, 3, 3, -100])) == (3, 1.0, 3)
    assert d.batch_label_summary(torch.tensor([10**9, 10**9, 2, 10**9])) == (10**9, 0.75, 4)
