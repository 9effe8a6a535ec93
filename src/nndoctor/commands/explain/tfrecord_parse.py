"""E135: a TFRecord's ``tf.train.Example`` that the feature spec cannot parse.

TensorFlow names the feature ("Key: label. Can't parse serialized Example", "Data types don't
match", "Feature: y … is required but could not be found") but neither the record nor whether
the spec or the data is wrong. In a live run this explanation finds the TFRecord files and
the feature spec the script uses (its frames' variables and module globals), scans the files
with ``nndoctor data``'s reader (no TensorFlow) and says which: every record disagrees with the
spec (fix the spec), or a few records differ from the rest (F202's inconsistent records —
named — fix the data). From a pasted log it names the feature and points at ``nndoctor data``.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any

from nndoctor.commands.explain.base import CrashExplanation
from nndoctor.commands.explain.crash import Crash
from nndoctor.core.findings import Finding
from nndoctor.core.registry import register

_KINDS = {"float32": "float", "float64": "float", "float16": "float", "bfloat16": "float", "int64": "int64",
          "int32": "int64", "int16": "int64", "int8": "int64", "uint8": "int64", "bool": "int64", "string": "bytes"}
_MAX_FILES = 64
_MAX_BYTES = 2 << 30  # scanning stays a small part of a crash report: at most 2 GiB of records


def spec_kind(dtype: Any) -> str | None:
    """The Example list kind a feature dtype parses from: float, int64 or bytes."""
    name = getattr(dtype, "name", None) or str(dtype)
    return _KINDS.get(name.replace("tf.", ""))


def key_profile(key: str, summaries: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """How the records hold ``key``: kinds, lengths and the records without it (pure)."""
    import json

    kinds: Counter = Counter()
    lengths: Counter = Counter()
    length_records: dict[str, list[str]] = {}
    missing: list[str] = []
    missing_count = total = 0
    for path, summary in summaries:
        total += summary["records"] - len(summary["unparseable"])
        for signature, (count, examples) in summary["signatures"].items():
            pairs = dict(tuple(p) for p in json.loads(signature))
            if key in pairs:
                kinds[pairs[key]] += count
            else:
                missing_count += count
                missing += [f"{os.path.basename(path)}#{i}" for i in examples]
        for length, (count, examples) in summary["lengths"].get(key, {}).items():
            lengths[int(length)] += count
            length_records.setdefault(length, []).extend(f"{os.path.basename(path)}#{i}" for i in examples)
    return {"records": total, "kinds": dict(kinds), "lengths": dict(lengths), "missing": missing_count,
            "missing_records": missing[:10], "length_records": {k: v[:10] for k, v in length_records.items()}}


def verdict(key: str, profile: dict[str, Any], spec_length: int | None, kind: str | None) -> tuple[str, str]:
    """(cause, fix): is the spec wrong for every record, or are some records unlike the rest (pure)."""
    total, lengths, kinds = profile["records"], profile["lengths"], profile["kinds"]
    if total and profile["missing"] == total:
        return (f"no record has a feature '{key}'",
                f"use the key the records were written with, or give '{key}' a default_value in the spec")
    if profile["missing"]:
        return (f"{profile['missing']} of {total} records lack '{key}' (e.g. {', '.join(profile['missing_records'][:3])}) "
                "while the others have it: the records are inconsistent (F202)",
                f"regenerate those records, or give '{key}' a default_value; `nndoctor data DIR` lists every such record")
    if kind and kinds and kind not in kinds:
        stored = "/".join(sorted(kinds))
        return (f"every record stores '{key}' as a {stored} list and the spec parses it as {kind}",
                f"declare '{key}' with the dtype it was written with ({'tf.float32' if stored == 'float' else 'tf.int64' if stored == 'int64' else 'tf.string'}), "
                "then cast after parsing")
    if kind and len(kinds) > 1:
        odd = sorted(k for k in kinds if k != kind)
        return (f"'{key}' is {kind} in {kinds.get(kind, 0)} records and {'/'.join(odd)} in "
                f"{sum(kinds[k] for k in odd)}: the records are inconsistent (F202)",
                "regenerate the odd records with one type; `nndoctor data DIR` lists them")
    if spec_length is not None and lengths:
        if len(lengths) == 1:
            (only,) = lengths
            if only != spec_length:
                return (f"every record holds {only} values for '{key}' and the spec expects {spec_length}",
                        f"declare tf.io.FixedLenFeature([{only}], …) for '{key}' (or reshape after parsing)")
        else:
            odd_lengths = {n: c for n, c in lengths.items() if n != spec_length}
            examples = [r for n in odd_lengths for r in profile["length_records"].get(str(n), [])][:3]
            shown = ", ".join(f"{c} with {n}" for n, c in sorted(odd_lengths.items()))
            return (f"'{key}' has {spec_length} values in {lengths.get(spec_length, 0)} records but other lengths in "
                    f"{sum(odd_lengths.values())} ({shown}; e.g. {', '.join(examples)}): the records are inconsistent (F202)",
                    f"regenerate those records, or parse '{key}' as tf.io.VarLenFeature / RaggedFeature and pad; "
                    "`nndoctor data DIR` lists every such record")
    return (f"the records' '{key}' does not match the feature spec", _FIX)


_FIX = ("compare the spec with how the records were written (`nndoctor data DIR` lists records whose keys, types "
        "or lengths differ: F202); declare varying features as tf.io.VarLenFeature / RaggedFeature")


@register
class TFRecordParseFailed(CrashExplanation):
    """
    ## What it does
    Explains ``tf.io.parse_example`` / ``parse_single_example`` failures in a ``tf.data``
    pipeline ("Key: label. Can't parse serialized Example", "Data types don't match",
    "Feature: y (data type: int64) is required but could not be found", "Number of float values
    != expected"). In a live run it finds the TFRecord files and the feature spec the script
    uses, scans the files like ``nndoctor data`` does, and says whether the spec is wrong for
    every record (another length, dtype or key) or whether some records differ from the rest —
    the inconsistent records F202 reports, named by file and index.

    ## Why is this bad?
    The error names the feature, not the record, and usually surfaces mid-epoch when the
    shuffle buffer reaches an odd record. Whether the spec or the data must change is the
    first question, and the message does not answer it.

    ## Example
    ```python
    spec = {"bbox": tf.io.FixedLenFeature([4], tf.float32)}   # a few records hold 8 values
    ds = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec))
    ```

    ## Use instead
    ```python
    spec = {"bbox": tf.io.VarLenFeature(tf.float32)}          # or regenerate the odd records
    ```
    Run ``nndoctor data DIR`` on the records (F202 lists every record whose keys, types or
    lengths differ).

    ## References
    - TensorFlow, "TFRecord and tf.train.Example": https://www.tensorflow.org/tutorials/load_data/tfrecord
    - TensorFlow docs, `tf.io.FixedLenFeature` / `tf.io.VarLenFeature`: https://www.tensorflow.org/api_docs/python/tf/io/FixedLenFeature
    - imcaspar/gpt2-ml#64, A-bone1/Attention-ocr-Chinese-Version#26 (the error as users report it).
    """

    code = "E135"
    name = "tfrecord-parse-failed"
    summary = "a TFRecord's Example does not match the feature spec (spec wrong, or inconsistent records: F202)"
    fix = _FIX
    patterns = (
        r"Key: (?P<key>[\w/.:-]+)\.\s+Can't parse serialized Example(?::\s*(?P<detail>[^\n\[]+))?",
        r"Key: (?P<key_t>[\w/.:-]+)\.\s+Data types don't match\. Data type: (?P<stored>\w+) but expected type: (?P<wanted>\w+)",
        r"Feature: (?P<key_m>[\w/.:-]+) \(data type: (?P<wanted_m>\w+)\) is required but could not be found",
        r"Key: (?P<key_n>[\w/.:-]+), Index: \d+\.\s+Number of (?P<stored_n>\w+) values != expected\.\s+"
        r"Values size: (?P<size>\d+) but output shape: \[(?P<out>[\d, ]*)\]",
        r"(?P<corrupt>Could not parse example input)",
    )
    order = 30

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        key = facts.get("key") or facts.get("key_t") or facts.get("key_m") or facts.get("key_n")
        evidence: dict[str, Any] = {"feature": key} if key else {}
        if "corrupt" in facts:
            message = ("A record is not a serialized tf.train.Example (corrupt bytes, or a file written in another "
                       "format).")
            return cls.make(crash, message, fix="run `nndoctor data DIR` on the records (F201 corrupt, F202 schema)",
                            evidence=evidence)
        if "stored" in facts:
            cause = f"the records store '{key}' as {facts['stored']} and the spec parses it as {facts['wanted']}"
            fix = f"declare '{key}' with dtype {facts['stored']} in the spec (cast after parsing), or fix the writer"
        elif "key_m" in facts:
            cause = f"a record has no feature '{key}' and the spec requires it ({facts['wanted_m']})"
            fix = f"give '{key}' a default_value, or check the key's name against the records (`nndoctor data DIR`, F202)"
        elif "size" in facts:
            out = [int(p) for p in re.split(r"[,\s]+", facts["out"].strip()) if p]
            cause = f"a record holds {facts['size']} values for '{key}' and the spec's shape is {out}"
            fix = _FIX
        else:
            cause = f"the records' '{key}' does not match the feature spec (another length or dtype)"
            fix = _FIX
        live = _live_verdict(crash, key) if key else None
        if live is not None:
            cause, fix, found = live
            evidence.update(found)
        message = f"A TFRecord could not be parsed with the feature spec: {cause}."
        return cls.make(crash, message, fix=fix, evidence=evidence)


def _live_verdict(crash: Crash, key: str) -> tuple[str, str, dict[str, Any]] | None:
    if not crash.is_live:
        return None
    files, spec = _files_and_spec(crash, key)
    if not files:
        return None
    from nndoctor.commands.data.tfrecord import scan_tfrecord

    summaries, scanned = [], 0
    for path in files[:_MAX_FILES]:
        scanned += os.path.getsize(path)
        if scanned > _MAX_BYTES:
            break
        summaries.append((path, scan_tfrecord(path)))
    profile = key_profile(key, summaries)
    length = kind = None
    if spec is not None:
        shape = list(getattr(spec, "shape", []) or [])
        length = 1
        for dim in shape:
            length *= int(dim)
        kind = spec_kind(getattr(spec, "dtype", None))
    cause, fix = verdict(key, profile, length if spec is not None and hasattr(spec, "default_value") else None, kind)
    found = {"files": [os.path.basename(p) for p, _ in summaries], "records": profile["records"],
             "stored_kinds": profile["kinds"], "stored_lengths": profile["lengths"]}
    if spec is not None:
        found["spec"] = f"{type(spec).__name__}(shape={list(getattr(spec, 'shape', []) or [])}, dtype={getattr(spec, 'dtype', '?')!r})"
    return cause, fix, found


def _files_and_spec(crash: Crash, key: str) -> tuple[list[str], Any]:
    """TFRecord files and the feature spec entry for ``key`` visible from the user's frames."""
    from nndoctor.commands.data.tfrecord import is_tfrecord_name

    files: list[str] = []
    spec = None
    user_files = {f.path for f in crash.frames if f.is_user}
    for frame in crash.live_frames():
        if frame.f_code.co_filename not in user_files:
            continue
        for scope in (frame.f_locals, frame.f_globals):
            for value in list(scope.values()):
                for path in _paths_in(value):
                    if is_tfrecord_name(os.path.basename(path)) and os.path.isfile(path) and path not in files:
                        files.append(path)
                if spec is None and isinstance(value, dict) and key in value and hasattr(value[key], "dtype"):
                    spec = value[key]
    return files, spec


def _paths_in(value: Any) -> list[str]:
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    if isinstance(value, (list, tuple)) and len(value) <= 10000:
        return [os.fspath(v) for v in value if isinstance(v, (str, os.PathLike))]
    names = getattr(value, "_filenames", None)  # a tf.data.TFRecordDataset built inline
    if names is not None and hasattr(names, "numpy"):
        try:
            listed = names.numpy()
            listed = [listed] if isinstance(listed, bytes) else list(listed)[:10000]
            return [n.decode("utf-8", "replace") for n in listed if isinstance(n, bytes)]
        except Exception:  # noqa: BLE001 - a symbolic tensor: no values to read
            return []
    return []
