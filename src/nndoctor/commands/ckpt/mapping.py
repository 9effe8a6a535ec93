"""Proposing how a checkpoint's keys map onto a model's keys.

Pure functions over ``{key: TensorInfo}``: no torch needed, easy to test. Rules are found
greedily: among keys not yet matched, the (old prefix → new prefix) pair that matches the
most keys with identical suffix *and* shape wins, then the next. That one mechanism covers
stripping wrappers (``module.`` → ``""``), adding a prefix (``""`` → ``backbone.``) and
renames matched by structure (``conv1.`` → ``stem.``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nndoctor.commands.ckpt.checkpoint import TensorInfo

_MAX_PREFIX_DEPTH = 3
_MAX_ROUNDS = 50


@dataclass(frozen=True)
class RenameRule:
    """Replace the leading ``old`` of a key by ``new``."""

    old: str
    new: str
    count: int = 0

    @property
    def kind(self) -> str:
        if not self.new:
            return "strip-prefix"
        if not self.old:
            return "add-prefix"
        return "rename"

    def describe(self) -> str:
        if self.kind == "strip-prefix":
            return f"strip prefix '{self.old}'"
        if self.kind == "add-prefix":
            return f"add prefix '{self.new}'"
        return f"rename {self.old.rstrip('.')}.* → {self.new.rstrip('.')}.*"

    def as_option(self) -> str:
        if self.kind == "strip-prefix":
            return f"--strip-prefix {self.old}"
        if self.kind == "add-prefix":
            return f"--add-prefix {self.new}"
        return f"--rename '^{re.escape(self.old)}={self.new}'"

    def apply(self, key: str) -> str | None:
        return self.new + key[len(self.old):] if key.startswith(self.old) else None


@dataclass
class KeyMapping:
    """Everything diff knows about fitting a source state dict to a target."""

    rules: list[RenameRule] = field(default_factory=list)
    source_to_target: dict[str, str] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)  # source keys with no target
    missing: list[str] = field(default_factory=list)  # target keys with no source
    shape_mismatches: list[tuple[str, str, TensorInfo, TensorInfo]] = field(default_factory=list)
    dtype_mismatches: list[tuple[str, str, TensorInfo, TensorInfo]] = field(default_factory=list)
    head_changes: list[tuple[str, str, TensorInfo, TensorInfo]] = field(default_factory=list)
    exact: int = 0

    @property
    def matched(self) -> int:
        return len(self.source_to_target) - len(self.shape_mismatches) - len(self.head_changes)

    @property
    def is_identity(self) -> bool:
        return not self.rules and all(s == t for s, t in self.source_to_target.items())

    @property
    def loads_strictly(self) -> bool:
        return not (self.unexpected or self.missing or self.shape_mismatches or self.head_changes)


def _prefixes(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:i]) + "." for i in range(1, min(_MAX_PREFIX_DEPTH, len(parts) - 1) + 1)]


def _index(keys: list[str], infos: dict[str, TensorInfo]) -> dict[str, set[tuple[str, tuple[int, ...]]]]:
    """prefix ("" included) -> {(suffix, shape)} over ``keys``."""
    index: dict[str, set[tuple[str, tuple[int, ...]]]] = {"": {(k, infos[k].shape) for k in keys}}
    for key in keys:
        for prefix in _prefixes(key):
            index.setdefault(prefix, set()).add((key[len(prefix):], infos[key].shape))
    return index


def _first_position(keys: list[str], prefix: str) -> float:
    for i, key in enumerate(keys):
        if key.startswith(prefix):
            return i / max(1, len(keys))
    return 1.0


def _best_rule(src_keys: list[str], src: dict[str, TensorInfo], dst_keys: list[str],
               dst: dict[str, TensorInfo]) -> RenameRule | None:
    src_index, dst_index = _index(src_keys, src), _index(dst_keys, dst)
    best: tuple[int, float, int] | None = None
    best_rule = None
    for old, src_set in src_index.items():
        for new, dst_set in dst_index.items():
            if old == new:
                continue
            score = len(src_set & dst_set)
            if score == 0:
                continue
            # Prefer more keys, then rules that keep the order of the two files (two identical
            # blocks renamed map first-to-first), then shorter rules.
            order = -abs(_first_position(src_keys, old) - _first_position(dst_keys, new))
            key = (score, order, -(len(old) + len(new)))
            if best is None or key > best:
                best, best_rule = key, RenameRule(old, new, score)
    return best_rule


def propose_mapping(src: dict[str, TensorInfo], dst: dict[str, TensorInfo]) -> KeyMapping:
    """How the keys of ``src`` (a checkpoint) map onto ``dst`` (a model or checkpoint)."""
    result = KeyMapping()
    mapped: dict[str, str] = {k: k for k in src if k in dst and src[k].shape == dst[k].shape}
    result.exact = len(mapped)
    for _ in range(_MAX_ROUNDS):
        taken = set(mapped.values())
        src_left = [k for k in src if k not in mapped]
        dst_left = [k for k in dst if k not in taken]
        if not src_left or not dst_left:
            break
        rule = _best_rule(src_left, src, dst_left, dst)
        if rule is None:
            break
        applied = 0
        # A rule renames every remaining key under its prefix, including ones whose shape
        # then differs (a resized head), so those are reported under their new name.
        for key in src_left:
            target = rule.apply(key)
            if target is not None and target in dst and target not in taken:
                mapped[key] = target
                taken.add(target)
                applied += 1
        result.rules.append(RenameRule(rule.old, rule.new, applied))
    # Keys with the same name but another shape pair up as mismatches.
    taken = set(mapped.values())
    for key in src:
        if key not in mapped and key in dst and key not in taken:
            mapped[key] = key
            taken.add(key)
    result.source_to_target = mapped
    result.unexpected = [k for k in src if k not in mapped]
    result.missing = [k for k in dst if k not in taken]
    last_module = _module_of(next(reversed(dst))) if dst else None
    for s_key, d_key in mapped.items():
        s_info, d_info = src[s_key], dst[d_key]
        if s_info.shape != d_info.shape:
            entry = (s_key, d_key, s_info, d_info)
            if _is_head_change(d_key, s_info, d_info, last_module, dst):
                result.head_changes.append(entry)
            else:
                result.shape_mismatches.append(entry)
        elif s_info.dtype != d_info.dtype:
            result.dtype_mismatches.append((s_key, d_key, s_info, d_info))
    return result


def _is_tf_path(key: str) -> bool:
    """A TensorFlow checkpoint key (``model/layer/_kernel``): "/"-separated, Keras layout."""
    return "/" in key and "." not in key


def _module_of(key: str) -> str:
    return key.rpartition("/" if _is_tf_path(key) else ".")[0]


def _output_axis(key: str) -> int:
    """Where a weight keeps its outputs: PyTorch [out, in, ...], a Keras kernel [..., in, out]."""
    return -1 if _is_tf_path(key) and key.rpartition("/")[2].lstrip("_") == "kernel" else 0


def _is_head_change(key: str, s: TensorInfo, d: TensorInfo, last_module: str | None,
                    dst: dict[str, TensorInfo]) -> bool:
    """The model's last parameterised module, differing only in its output dimension."""
    if not s.shape or len(s.shape) != len(d.shape):
        return False
    axis = _output_axis(key) % len(s.shape)
    if s.shape[:axis] + s.shape[axis + 1:] != d.shape[:axis] + d.shape[axis + 1:]:
        return False
    module = _module_of(key)
    last_weighted = None
    for k in dst:
        if k.endswith((".weight", ".bias")) or (_is_tf_path(k) and k.endswith(("/kernel", "/_kernel", "/bias"))):
            last_weighted = _module_of(k)
    return module in (last_module, last_weighted)


def class_counts(head_changes: list[tuple[str, str, TensorInfo, TensorInfo]]) -> tuple[int, int] | None:
    for _s, d_key, s_info, d_info in head_changes:
        if d_key.endswith(("weight", "bias", "kernel")):
            axis = _output_axis(d_key)
            return s_info.shape[axis], d_info.shape[axis]
    return None


def parse_rename(text: str) -> tuple[re.Pattern[str], str]:
    """``REGEX=REPLACEMENT`` as given to ``fix --rename``."""
    pattern, sep, replacement = text.partition("=")
    if not sep or not pattern:
        raise ValueError(f"--rename expects REGEX=REPLACEMENT, got {text!r}")
    try:
        return re.compile(pattern), replacement
    except re.error as error:
        raise ValueError(f"--rename: bad regular expression {pattern!r}: {error}") from None
