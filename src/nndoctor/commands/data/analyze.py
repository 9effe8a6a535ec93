"""Turn a finished image scan into findings: per-file problems and the cross-file checks."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from itertools import groupby

import numpy as np

from nndoctor.commands.data import checks, filechecks
from nndoctor.commands.data.layout import TRAIN_NAMES, Split, display
from nndoctor.commands.data.messages import listing, plural
from nndoctor.commands.data.scan import ScanResult
from nndoctor.core.findings import Finding, Location, Severity

NEAR_DISTANCE = 6  # pHash bits; see CrossSplitDuplicates' documentation
IMBALANCE_RATIO = 10.0  # largest / smallest class; see ClassImbalance's documentation
PAIRS_KEPT = 100_000  # near-duplicate pairs kept (a pathological dataset could have millions)
_COMPARE_CELLS = 1 << 22  # XOR matrix cells per block of the near-duplicate search


@dataclass
class AnalysisOptions:
    crop: int | None = None
    near_distance: int = NEAR_DISTANCE
    near_duplicates: bool = True


def files_finding(
    check: type[checks.DataCheck], rows: list[tuple[str, str]], what: str,
    severity: Severity | None = None, noun: str = "file", **evidence,
) -> Finding:
    """One finding naming every (path, detail) row: the first few in the message, all in JSON."""
    files = [path for path, _ in rows]
    message = f"{what}: {plural(len(rows), noun)} — " + listing([f"{p} ({d})" for p, d in rows])
    return check.finding(
        message,
        location=Location(files[0]),
        severity=severity,
        evidence={"count": len(files), "files": files, "reasons": dict(rows), **evidence},
    )


def image_findings(result: ScanResult, options: AnalysisOptions) -> list[Finding]:
    out: list[Finding] = []
    out += _unreadable(result)
    out += _per_file(result, checks.FormatExtensionMismatch, "F104", "content does not match the extension")
    out += _per_file(result, checks.NonImageFile, "F105", "non-image files in image folders")
    out += _per_file(result, checks.ExifRotation, "F111", "EXIF orientation that loaders ignore")
    out += _degenerate(result)
    out += _mixed_modes(result)
    out += _sizes(result, options.crop)
    out += _phantom_classes(result)
    out += _split_classes(result)
    out += _imbalance(result)
    out += _exact_duplicates(result)
    out += _cross_split(result, options)
    out += _statistics(result)
    return out


# -- per-file problems ---------------------------------------------------------------------
def _noun(result: ScanResult) -> str:
    """What the findings count: files, or records of HDF5/LMDB/… files."""
    splits = result.plan.splits
    return "record" if splits and all(s.records for s in splits) else "file"


def _unreadable(result: ScanResult) -> list[Finding]:
    rows = [(path, detail) for _, path, detail in result.index.issues("F101")]
    rows += [(display(path), reason) for path, reason in result.walk.unreadable]
    out = []
    if rows:
        out.append(files_finding(checks.UnreadableFile, rows, "unreadable or undecodable", noun=_noun(result)))
    if result.walk.bad_names:
        names = [(display(p), "name is not valid UTF-8") for p in result.walk.bad_names]
        out.append(files_finding(
            checks.UnreadableFile, names,
            "names that are not valid UTF-8 (JSON manifests, TF and many tools cannot represent them)",
            severity=Severity.WARNING,
        ))
    return out


def _per_file(result: ScanResult, check: type[checks.DataCheck], code: str, what: str) -> list[Finding]:
    rows = [(path, detail) for _, path, detail in result.index.issues(code)]
    return [files_finding(check, rows, what, noun=_noun(result))] if rows else []


def _degenerate(result: ScanResult) -> list[Finding]:
    """F112: the per-file verdicts, plus images tiny next to the dataset's median size."""
    rows = [(path, detail) for _, path, detail in result.index.issues("F112")]
    rows += _relatively_tiny(result.index, {path for path, _ in rows})
    if not rows:
        return []
    rows.sort()
    return [files_finding(checks.DegenerateImage, rows, "degenerate images (tiny, extreme aspect ratio or blank)",
                          noun=_noun(result))]


def _relatively_tiny(index, already: set[str]) -> list[tuple[str, str]]:
    (count,) = next(index.query("SELECT COUNT(*) FROM images"))
    if count < filechecks.RELATIVE_MIN_IMAGES:
        return []
    median = _percentiles(index, "MIN(width, height)", count)[1]
    limit = filechecks.RELATIVE_TINY * median
    rows = []
    for path, width, height in index.query(
        "SELECT path, width, height FROM images WHERE MIN(width, height) < ? ORDER BY path", (limit,)
    ):
        reason = filechecks.relatively_tiny_reason(width, height, median)
        if reason and path not in already:
            rows.append((path, reason))
    return rows


# -- cross-file checks ---------------------------------------------------------------------
def _mixed_modes(result: ScanResult) -> list[Finding]:
    modes = list(result.index.query("SELECT mode, COUNT(*) FROM images GROUP BY mode ORDER BY 2 DESC, 1"))
    if len(modes) < 2:
        return []
    majority = modes[0][0]
    rows = [
        (path, f"{mode}, not {majority}")
        for path, mode in result.index.query("SELECT path, mode FROM images WHERE mode != ? ORDER BY path", (majority,))
    ]
    counts = {mode: n for mode, n in modes}
    return [files_finding(checks.MixedColorModes, rows, f"colour mode differs from the majority ({majority})",
                          noun=_noun(result), modes=counts)]


def _sizes(result: ScanResult, crop: int | None) -> list[Finding]:
    index = result.index
    if crop is not None:
        rows = [
            (path, f"{w}x{h}")
            for path, w, h in index.query(
                "SELECT path, width, height FROM images WHERE width < ? OR height < ? ORDER BY path", (crop, crop)
            )
        ]
        if not rows:
            return []
        return [files_finding(checks.ImageSmallerThanCrop, rows, f"smaller than the {crop}x{crop} crop", crop=crop)]
    (count, distinct) = next(index.query("SELECT COUNT(*), COUNT(DISTINCT width || 'x' || height) FROM images"))
    if distinct < 2:
        return []
    shorter = _percentiles(index, "MIN(width, height)", count)
    (smallest_path, sw, sh) = next(index.query("SELECT path, width, height FROM images ORDER BY MIN(width, height), path LIMIT 1"))
    (largest_path, lw, lh) = next(index.query("SELECT path, width, height FROM images ORDER BY MAX(width, height) DESC, path LIMIT 1"))
    message = (
        f"image sizes vary ({distinct:,} distinct sizes, from {sw}x{sh} to {lw}x{lh}; shorter side "
        f"p5/p50/p95 = {shorter[0]}/{shorter[1]}/{shorter[2]} px): batches need a Resize or crop. "
        "Pass --crop N to list the images smaller than your training crop."
    )
    return [checks.ImageSmallerThanCrop.finding(
        message, location=Location(smallest_path), severity=Severity.INFO,
        evidence={"distinct_sizes": distinct, "smallest": [smallest_path, sw, sh],
                  "largest": [largest_path, lw, lh], "shorter_side_p5_p50_p95": shorter},
    )]


def _percentiles(index, expression: str, count: int) -> list[int]:
    values = []
    for q in (0.05, 0.5, 0.95):
        offset = min(count - 1, int(q * count))
        values.append(next(index.query(f"SELECT {expression} AS v FROM images ORDER BY v LIMIT 1 OFFSET ?", (offset,)))[0])
    return values


def _class_table(split: Split) -> list[str]:
    return sorted(split.classes + split.phantom)


def _phantom_classes(result: ScanResult) -> list[Finding]:
    rows = []
    for split in result.plan.splits:
        table = _class_table(split)
        for name in split.phantom:
            path = os.path.join(split.root, name)
            files = result.walk.phantom_files.get(path, 0)
            rows.append((display(path), f"class {table.index(name)} of {len(table)}, {plural(files, 'file')}"))
    if not rows:
        return []
    return [files_finding(
        checks.PhantomClassDirectory, rows,
        "folders ImageFolder would take as classes, shifting the real class indices",
        noun="folder",
    )]


def _reference_split(splits: list[Split]) -> Split:
    return next((s for s in splits if s.name.lower() in TRAIN_NAMES), splits[0])


def _split_classes(result: ScanResult) -> list[Finding]:
    # Record files carry their labels as numbers or names, not folder order: no index shift.
    splits = [s for s in result.plan.splits if not s.flat and not s.records]
    if len(splits) < 2:
        return []
    reference = _reference_split(splits)
    ref_index = {c: i for i, c in enumerate(_class_table(reference))}
    out = []
    for split in splits:
        if split is reference or split.classes == reference.classes:
            continue
        missing = sorted(set(reference.classes) - set(split.classes))
        extra = sorted(set(split.classes) - set(reference.classes))
        shifted = [
            f"{c}: {ref_index[c]} in {reference.name}, {i} in {split.name}"
            for i, c in enumerate(_class_table(split)) if c in ref_index and ref_index[c] != i
        ]
        parts = []
        if missing:
            parts.append(f"lacks {listing(missing)}")
        if extra:
            parts.append(f"has {listing(extra)} that {reference.name} lacks")
        message = (
            f"split {split.name} ({plural(len(split.classes), 'class', 'classes')}) {' and '.join(parts)} "
            f"compared with {reference.name} ({plural(len(reference.classes), 'class', 'classes')})"
        )
        message += f"; class indices shift ({listing(shifted)})" if shifted else ""
        out.append(checks.SplitClassMismatch.finding(
            message, location=Location(display(split.root)),
            evidence={"split": split.name, "reference": reference.name, "missing": missing,
                      "extra": extra, "shifted": shifted},
        ))
    return out


def _imbalance(result: ScanResult) -> list[Finding]:
    out = []
    for split in result.plan.splits:
        if split.flat or len(split.classes) < 2:
            continue
        counts = {c: result.splits[split.name].class_images.get(c, 0) for c in split.classes}
        largest = max(counts.values())
        empty = [c for c, n in counts.items() if n == 0]
        small = [c for c, n in counts.items() if 0 < n and largest / n > IMBALANCE_RATIO]
        if not empty and not small:
            continue
        parts = []
        if empty:
            parts.append(f"{plural(len(empty), 'class', 'classes')} with no readable image ({listing(empty)})")
        if small:
            shown = [f"{c}: {counts[c]}" for c in sorted(small, key=lambda c: counts[c])]
            parts.append(f"{plural(len(small), 'class', 'classes')} under 1/{IMBALANCE_RATIO:g} of the largest ({largest:,}): {listing(shown)}")
        out.append(checks.ClassImbalance.finding(
            f"split {split.name}: " + "; ".join(parts),
            location=Location(display(split.root if split.records or split.remote is not None
                                      else os.path.join(split.root, (empty + small)[0]))),
            evidence={"split": split.name, "empty": empty, "under_represented": small,
                      "largest": largest, "counts": counts},
        ))
    return out


def _exact_duplicates(result: ScanResult) -> list[Finding]:
    rows = result.index.query(
        "SELECT split, digest, cls, path FROM images WHERE (split, digest) IN "
        "(SELECT split, digest FROM images GROUP BY split, digest HAVING COUNT(*) > 1) "
        "ORDER BY split, digest, path"
    )
    groups = []
    cross_class = []
    for _, group in groupby(rows, key=lambda r: (r[0], r[1])):
        members = list(group)
        paths = [m[3] for m in members]
        groups.append(paths)
        if len({m[2] for m in members}) > 1:
            cross_class.append(paths)
    if not groups:
        return []
    files = [p for g in groups for p in g]
    message = (
        f"{plural(len(files), _noun(result))} in {plural(len(groups), 'group')} of identical content: "
        + listing([" = ".join(g[:3]) for g in groups])
    )
    if cross_class:
        message += f"; {plural(len(cross_class), 'group')} span different classes (contradictory labels)"
    return [checks.ExactDuplicates.finding(
        message, location=Location(files[0]),
        evidence={"count": len(files), "files": files, "groups": groups, "cross_class_groups": cross_class},
    )]


def _eval_side(a: str, b: str) -> bool:
    """True when split ``a`` is the evaluation side of the pair (b is train, or a is later)."""
    return b.lower() in TRAIN_NAMES or (a.lower() not in TRAIN_NAMES and a > b)


def _cross_split(result: ScanResult, options: AnalysisOptions) -> list[Finding]:
    names = [s.name for s in result.plan.splits]
    if len(names) < 2:
        return []
    index = result.index
    pairs: list[tuple[str, str, int]] = []  # (evaluation file, other file, distance)
    exact_rows = index.query(
        "SELECT digest, split, path FROM images WHERE digest IN "
        "(SELECT digest FROM images GROUP BY digest HAVING COUNT(DISTINCT split) > 1) ORDER BY digest, split, path"
    )
    for _, group in groupby(exact_rows, key=lambda r: r[0]):
        members = list(group)
        for i, (_, split_a, path_a) in enumerate(members):
            for _, split_b, path_b in members[i + 1:]:
                if split_a != split_b:
                    first = _eval_side(split_a, split_b)
                    pairs.append((path_a, path_b, 0) if first else (path_b, path_a, 0))
    exact = len(pairs)
    if options.near_duplicates:
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                pairs += _near_pairs(index, a, b, options.near_distance, PAIRS_KEPT - len(pairs))
    if not pairs:
        return []
    near = len(pairs) - exact
    eval_files = sorted({p[0] for p in pairs})
    shown = [f"{e} ≈ {o} (distance {d})" if d or i >= exact else f"{e} = {o}" for i, (e, o, d) in enumerate(pairs)]
    message = (
        f"{plural(len(eval_files), 'image')} of one split also {'appears' if len(eval_files) == 1 else 'appear'} in another "
        f"({exact:,} byte-identical pair{'s' * (exact != 1)}, {near:,} near-duplicate pair{'s' * (near != 1)} "
        f"at pHash distance ≤ {options.near_distance}): {listing(shown)}"
    )
    return [checks.CrossSplitDuplicates.finding(
        message, location=Location(eval_files[0]),
        evidence={"count": len(eval_files), "files": eval_files, "exact_pairs": exact, "near_pairs": near,
                  "near_distance": options.near_distance,
                  "pairs": [{"file": e, "duplicate_of": o, "distance": d} for e, o, d in pairs]},
    )]


def _near_pairs(index, a: str, b: str, distance: int, room: int) -> list[tuple[str, str, int]]:
    """Pairs across splits a and b within ``distance`` bits and with different bytes."""
    if room <= 0:
        return []
    sql = "SELECT rowid, phash, digest FROM images WHERE split = ? AND phash IS NOT NULL"
    smaller, larger = sorted((a, b), key=lambda s: next(index.query("SELECT COUNT(*) FROM images WHERE split = ?", (s,)))[0])
    held = list(index.query(sql, (smaller,)))
    if not held:
        return []
    held_ids = np.array([r[0] for r in held], dtype=np.int64)
    held_hash = np.array([r[1] for r in held], dtype=np.int64).view(np.uint64)
    held_digest = [r[2] for r in held]
    del held
    rows_per_block = max(1, _COMPARE_CELLS // len(held_ids))
    cursor = index.query(sql, (larger,))
    found: list[tuple[int, int, int]] = []
    while block := cursor.fetchmany(rows_per_block):
        hashes = np.array([r[1] for r in block], dtype=np.int64).view(np.uint64)
        distances = np.bitwise_count(hashes[:, None] ^ held_hash[None, :])
        for i, j in zip(*np.nonzero(distances <= distance)):
            if block[i][2] != held_digest[j]:  # byte-identical pairs are already reported
                found.append((int(block[i][0]), int(held_ids[j]), int(distances[i, j])))
        if len(found) >= room:
            break
    out = []
    for large_id, small_id, d in found[:room]:
        (large_path, large_split) = next(index.query("SELECT path, split FROM images WHERE rowid = ?", (large_id,)))
        (small_path, small_split) = next(index.query("SELECT path, split FROM images WHERE rowid = ?", (small_id,)))
        if _eval_side(large_split, small_split):
            out.append((large_path, small_path, d))
        else:
            out.append((small_path, large_path, d))
    out.sort()
    return out


GRAYSCALE_MODES = ("1", "L", "LA", "I", "F")  # Pillow modes without colour; also I;16, I;16B …


def _all_grayscale(result: ScanResult, splits: list[str]) -> bool:
    marks = ",".join("?" * len(splits))
    modes = [row[0] for row in result.index.query(f"SELECT DISTINCT mode FROM images WHERE split IN ({marks})",
                                                     tuple(splits))]
    return bool(modes) and all(m in GRAYSCALE_MODES or m.startswith("I;16") for m in modes)


def _statistics(result: ScanResult) -> list[Finding]:
    splits = result.plan.splits
    if not splits:
        return []
    train = [s for s in splits if s.name.lower() in TRAIN_NAMES] or splits
    images = sum(result.splits[s.name].images for s in train)
    if images == 0:
        return []
    sums = [sum(result.splits[s.name].moments[k] for s in train) for k in range(6)]
    mean = [v / images for v in sums[:3]]
    std = [math.sqrt(max(sums[3 + c] / images - mean[c] ** 2, 0.0)) for c in range(3)]
    gray = _all_grayscale(result, [s.name for s in train])
    if gray:  # one channel: a 3-value Normalize fails on 1-channel tensors (ToTensor of an "L" image)
        mean, std = mean[:1], std[:1]
    mean4, std4 = [round(v, 4) for v in mean], [round(v, 4) for v in std]
    mean255, std255 = [round(v * 255, 2) for v in mean], [round(v * 255, 2) for v in std]
    source = " and ".join(s.name for s in train)
    normalize = f"transforms.Normalize(mean={mean4}, std={std4})"
    counted = f"single-channel statistics of {plural(images, 'grayscale image')}" if gray else \
        f"per-channel RGB statistics of {plural(images, 'image')}"
    message = (
        f"{counted} ({source}): {normalize}; "
        f"on the 0–255 scale mean={mean255}, std={std255}"
    )
    return [checks.DatasetStatistics.finding(
        message, location=Location(display(train[0].root)),
        evidence={"mean": mean4, "std": std4, "mean_255": mean255, "std_255": std255,
                  "images": images, "splits": [s.name for s in train]},
        fix=f"When training from scratch, normalize with {normalize} (0–1 scale, after ToTensor), "
            f"or mean={mean255}, std={std255} on 0–255 pixels.",
    )]
