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
    python benchmarks/d103_channel_order.py --synthetic     # + noise, synthetic renders, GAN-like outputs

Natural photographs: random crops of scikit-learn's bundled photos (``load_sample_images``)
and, for more scenes made offline, the same crops flipped left-right and with a random
brightness/contrast/saturation jitter of up to ±20% (``--jitter``). Synthetic sets (channel
order meaningless there, so any firing is a false positive of the statistic): uniform and
Gaussian noise, smooth random colour fields, random coloured shapes, and the outputs of an
untrained generator network (DCGAN-style, tanh) — each scored in the order generated.
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


def jitter(rng: np.random.Generator, crop: np.ndarray) -> np.ndarray:
    """A plausible other photograph of the scene: mirrored, brightness/contrast/saturation ±20%."""
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    gray = crop.mean(axis=2, keepdims=True)
    crop = gray + (crop - gray) * rng.uniform(0.8, 1.2)  # saturation
    crop = (crop - crop.mean()) * rng.uniform(0.8, 1.2) + crop.mean()  # contrast
    return np.clip(crop * rng.uniform(0.8, 1.2), 0, 1).astype(np.float32)  # brightness


def measure(photos: dict[str, np.ndarray], decisions: int, seed: int, with_jitter: bool = False) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    images = list(photos.values())
    fired = {False: 0, True: 0}
    below = {False: 0, True: 0}

    def crop() -> np.ndarray:
        piece = random_crop(rng, images[int(rng.integers(len(images)))])
        return jitter(rng, piece) if with_jitter else piece

    for _ in range(decisions):
        batches = [np.stack([crop() for _ in range(BATCH)]) for _ in range(CHANNEL_ORDER_MIN_BATCHES)]
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


# -- synthetic inputs: channel order carries no meaning ------------------------------------

def _smooth(rng: np.random.Generator, n: int, cells: int) -> np.ndarray:
    coarse = torch.from_numpy(rng.random((n, 3, cells, cells), dtype=np.float32))
    return torch.nn.functional.interpolate(coarse, size=SIDE, mode="bilinear", align_corners=False).numpy()


def synthetic_batch(kind: str, rng: np.random.Generator, generator: torch.nn.Module) -> np.ndarray:
    """One batch (N, H, W, C) in [0, 1] of a synthetic kind."""
    n = BATCH
    if kind == "uniform noise":
        x = rng.random((n, 3, SIDE, SIDE), dtype=np.float32)
    elif kind == "gaussian noise":
        x = np.clip(rng.normal(0.5, 0.2, (n, 3, SIDE, SIDE)), 0, 1).astype(np.float32)
    elif kind == "smooth colour fields":
        x = _smooth(rng, n, 4)
    elif kind == "coloured shapes":
        x = np.empty((n, 3, SIDE, SIDE), dtype=np.float32)
        x[:] = rng.random((n, 3, 1, 1))
        yy, xx = np.mgrid[:SIDE, :SIDE]
        for i in range(n):
            for _ in range(int(rng.integers(1, 6))):
                cy, cx, r = rng.integers(0, SIDE, 2).tolist() + [int(rng.integers(4, 24))]
                x[i][:, (yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.random((3, 1))
    elif kind == "untrained generator (tanh)":
        with torch.no_grad():
            z = torch.from_numpy(rng.standard_normal((n, 32, 1, 1)).astype(np.float32))
            x = ((generator(z) + 1) / 2).numpy()
    else:  # pragma: no cover
        raise ValueError(kind)
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


SYNTHETIC = ("uniform noise", "gaussian noise", "smooth colour fields", "coloured shapes",
             "untrained generator (tanh)")


def dcgan_generator(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers, channels = [], [32, 64, 32, 16, 8]
    for c_in, c_out in zip(channels, channels[1:]):
        layers += [torch.nn.ConvTranspose2d(c_in, c_out, 4, 2, 1), torch.nn.BatchNorm2d(c_out), torch.nn.ReLU()]
    layers += [torch.nn.ConvTranspose2d(channels[-1], 3, 4, 2, 1), torch.nn.Upsample(size=SIDE), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers).eval()


def measure_synthetic(kind: str, decisions: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    generator = dcgan_generator(seed)
    fired = below = 0
    for _ in range(decisions):
        scores = [batch_score(synthetic_batch(kind, rng, generator), False) for _ in range(CHANNEL_ORDER_MIN_BATCHES)]
        fired += channel_order_swapped(scores)
        below += sum(s < CHANNEL_ORDER_THRESHOLD for s in scores)
    return {"fires": fired / decisions, "single_batch": below / (decisions * CHANNEL_ORDER_MIN_BATCHES)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skimage", action="store_true", help="add four scikit-image photographs")
    parser.add_argument("--per-image", action="store_true", help="also measure each photograph alone")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: stable on shared CPUs)")
    parser.add_argument("--jitter", action="store_true", help="also photos mirrored and colour-jittered")
    parser.add_argument("--synthetic", action="store_true", help="also noise, renders and generator outputs")
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
    images = args.decisions * CHANNEL_ORDER_MIN_BATCHES * BATCH
    for name, subset in sets.items():
        r = measure(subset, args.decisions, args.seed)
        print(f"{name:32s} FP {r['false_positive_rate']:.1%}  detection {r['detection_rate']:.1%}  "
              f"(single batch: FP {r['single_batch_fp']:.1%}, detection {r['single_batch_detection']:.1%}; "
              f"{images} crops)")
    if args.jitter:
        r = measure(sets["scikit-learn (china, flower)"], args.decisions, args.seed + 1, with_jitter=True)
        print(f"{'scikit-learn, jittered':32s} FP {r['false_positive_rate']:.1%}  detection "
              f"{r['detection_rate']:.1%}  (single batch: FP {r['single_batch_fp']:.1%}; {images} crops)")
    if args.synthetic:
        for kind in SYNTHETIC:
            r = measure_synthetic(kind, args.decisions, args.seed)
            print(f"{kind:32s} statistic fires {r['fires']:.1%}  (single batch {r['single_batch']:.1%}; "
                  f"{images} images) -> reported as info unless the pipeline shows RGB evidence")


if __name__ == "__main__":
    main()
