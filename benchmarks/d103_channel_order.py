"""Measure D103 channel-order-swapped: false positives on RGB photos, detections on BGR.

Batches of 16 random crops (48–160 px, resized to 64×64 by nearest-neighbour sampling) of
natural photographs are ImageNet-normalised, summarised by nndoctor's own TensorStats and
scored by the check's pure functions, exactly as at run time. One *decision* is what the
check concludes after 8 consecutive sampled batches (it fires only when every batch score
is below the threshold). Reported: the share of decisions that fire on correctly ordered
RGB crops (false-positive rate) and on the same crops with channels reversed (detection
rate), plus the single-batch rates for context.

    python benchmarks/d103_channel_order.py                 # scikit-learn's two photos
    python benchmarks/d103_channel_order.py --skimage       # + astronaut, chelsea, coffee, rocket
    python benchmarks/d103_channel_order.py --per-image     # each photo alone (worst cases)
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from nndoctor.checks.inputs import (
    CHANNEL_ORDER_MIN_BATCHES,
    CHANNEL_ORDER_THRESHOLD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    channel_order_swapped,
    red_minus_blue,
    unit_rgb_means,
)
from nndoctor.instrument.stats import summarize

BATCH = 16
SIDE = 64


def load_photos(with_skimage: bool) -> dict[str, np.ndarray]:
    from sklearn.datasets import load_sample_images

    sk = load_sample_images()
    photos = {name.rsplit("/", 1)[-1]: img for name, img in zip(sk.filenames, sk.images)}
    if with_skimage:
        import skimage.data

        for name in ("astronaut", "chelsea", "coffee", "rocket"):
            photos[name] = getattr(skimage.data, name)()
    return {k: v.astype(np.float32) / 255.0 for k, v in photos.items()}


def random_crop(rng: np.random.Generator, img: np.ndarray) -> np.ndarray:
    h, w, _ = img.shape
    side = int(rng.integers(48, 161))
    y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
    index = (np.arange(SIDE) * side / SIDE).astype(int)
    return img[y + index][:, x + index]


def batch_score(crops: np.ndarray, bgr: bool) -> float:
    """Score of one batch of H,W,C RGB crops, through the same code path as the check."""
    x = torch.from_numpy(crops).permute(0, 3, 1, 2)
    if bgr:
        x = x.flip(1)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    stats = summarize((x - mean) / std)
    unit = unit_rgb_means(stats.channel_mean_dim1, stats.min, stats.max)
    return red_minus_blue(unit)


def measure(photos: dict[str, np.ndarray], decisions: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    images = list(photos.values())
    fired = {False: 0, True: 0}
    below = {False: 0, True: 0}
    for _ in range(decisions):
        batches = [np.stack([random_crop(rng, images[int(rng.integers(len(images)))]) for _ in range(BATCH)])
                   for _ in range(CHANNEL_ORDER_MIN_BATCHES)]
        for bgr in (False, True):
            scores = [batch_score(b, bgr) for b in batches]
            fired[bgr] += channel_order_swapped(scores)
            below[bgr] += sum(s < CHANNEL_ORDER_THRESHOLD for s in scores)
    n_batches = decisions * CHANNEL_ORDER_MIN_BATCHES
    return {
        "false_positive_rate": fired[False] / decisions,
        "detection_rate": fired[True] / decisions,
        "single_batch_fp": below[False] / n_batches,
        "single_batch_detection": below[True] / n_batches,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skimage", action="store_true", help="add four scikit-image photographs")
    parser.add_argument("--per-image", action="store_true", help="also measure each photograph alone")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: stable on shared CPUs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    photos = load_photos(args.skimage or args.per_image)
    print(f"threshold {CHANNEL_ORDER_THRESHOLD}, {CHANNEL_ORDER_MIN_BATCHES} batches of {BATCH} crops per decision, "
          f"{args.decisions} decisions, seed {args.seed}")
    sets = {"scikit-learn (china, flower)": {k: v for k, v in photos.items() if k.endswith(".jpg")}}
    if args.skimage or args.per_image:
        sets["six photographs"] = photos
    if args.per_image:
        sets.update({k: {k: v} for k, v in photos.items()})
    for name, subset in sets.items():
        r = measure(subset, args.decisions, args.seed)
        print(f"{name:32s} FP {r['false_positive_rate']:.1%}  detection {r['detection_rate']:.1%}  "
              f"(single batch: FP {r['single_batch_fp']:.1%}, detection {r['single_batch_detection']:.1%})")


if __name__ == "__main__":
    main()
