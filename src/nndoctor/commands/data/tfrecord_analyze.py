"""Turn per-file TFRecord summaries into F201–F203 findings (schema compared across files)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

from nndoctor.commands.data import checks
from nndoctor.commands.data.layout import display
from nndoctor.commands.data.messages import listing, plural
from nndoctor.core.findings import Finding, Location

KEY_PRESENCE = 0.5  # a key in at least half the records is required; see F202's docs
LENGTH_DOMINANCE = 0.9  # a length shared by ≥90% of records is a fixed length; see F202
LOCATIONS_KEPT = 1000  # record locations kept per problem kind (bounded memory)


def _where(path: str, index: Any) -> str:
    return f"{display(path)}#{index}" if index is not None else display(path)


def tfrecord_findings(summaries: list[tuple[str, dict[str, Any]]]) -> list[Finding]:
    if not summaries:
        return []
    return _corrupt(summaries) + _schema(summaries) + _images(summaries)


def _records_finding(check, rows: list[tuple[str, Any, str]], total: int, what: str, **evidence) -> Finding:
    """rows: (file, record index, detail). Files are named in evidence["files"]."""
    records = [f"{_where(p, i)}: {d}" for p, i, d in rows]
    files = sorted({display(p) for p, _, _ in rows})
    message = f"{plural(total, 'record')} in {plural(len(files), 'file')} {what}: {listing(records, total)}"
    return check.finding(
        message, location=Location(display(rows[0][0])),
        evidence={"count": total, "files": files, "records": records, **evidence},
    )


def _corrupt(summaries) -> list[Finding]:
    rows = []
    for path, summary in summaries:
        for index, offset, reason in summary["corrupt"]:
            where = f"offset {offset}: " if offset is not None else ""
            rows.append((path, index, where + reason))
    if not rows:
        return []
    return [_records_finding(checks.TFRecordCorrupt, rows, len(rows), "are corrupt or truncated (framing/CRC)")]


def _schema(summaries) -> list[Finding]:
    total = sum(s["records"] - len(s["unparseable"]) for _, s in summaries)
    rows: list[tuple[str, Any, str]] = []
    counted = 0
    for path, summary in summaries:
        for index, reason in summary["unparseable"]:
            rows.append((path, index, f"not a tf.train.Example ({reason})"))
            counted += 1
    key_types: dict[str, Counter] = defaultdict(Counter)
    key_presence: Counter = Counter()
    for _, summary in summaries:
        for signature, (count, _) in summary["signatures"].items():
            for key, kind in json.loads(signature):
                key_types[key][kind] += count
                key_presence[key] += count
    # Types: a key seen with two types breaks FixedLenFeature for the minority type.
    for key, kinds in sorted(key_types.items()):
        if len(kinds) > 1:
            common = kinds.most_common(1)[0][0]
            for path, summary in summaries:
                for signature, (count, examples) in summary["signatures"].items():
                    pairs = {tuple(p) for p in json.loads(signature)}
                    odd = [k for (name, k) in pairs if name == key and k != common]
                    if odd:
                        counted += count
                        rows += [(path, i, f"{key!r} is {odd[0]}, elsewhere {common}") for i in examples]
    # Presence: a key most records have is required; records without it fail to parse.
    for key, present in sorted(key_presence.items()):
        if present < total and present >= KEY_PRESENCE * total:
            for path, summary in summaries:
                for signature, (count, examples) in summary["signatures"].items():
                    if key not in {name for name, _ in json.loads(signature)}:
                        counted += count
                        rows += [(path, i, f"{key!r} missing (present in {present:,} of {total:,})") for i in examples]
    # Lengths: a length nearly all records share is a FixedLenFeature shape.
    lengths: dict[str, Counter] = defaultdict(Counter)
    for _, summary in summaries:
        for key, per_length in summary["lengths"].items():
            for length, (count, _) in per_length.items():
                lengths[key][length] += count
    for key, counter in sorted(lengths.items()):
        if len(counter) < 2:
            continue
        common, common_count = counter.most_common(1)[0]
        if common_count < LENGTH_DOMINANCE * sum(counter.values()):
            continue
        for path, summary in summaries:
            for length, (count, examples) in summary["lengths"].get(key, {}).items():
                if length != common:
                    counted += count
                    rows += [(path, i, f"{key!r} has {length} values, {common_count:,} records have {common}") for i in examples]
    if not rows:
        return []
    rows = sorted(set(rows), key=lambda r: (r[0], r[1] if r[1] is not None else -1, r[2]))[:LOCATIONS_KEPT]
    schema = {key: dict(kinds) for key, kinds in sorted(key_types.items())}
    return [_records_finding(
        checks.TFRecordSchemaInconsistent, rows, max(counted, len(rows)),
        "differ from the schema the other records share", schema=schema,
    )]


def _images(summaries) -> list[Finding]:
    rows = []
    for path, summary in summaries:
        rows += [(path, index, f"{key!r}: {reason}") for index, key, reason in summary["bad_images"]]
    if not rows:
        return []
    return [_records_finding(checks.TFRecordUndecodableImage, rows, len(rows), "hold encoded images that do not decode")]
