"""Snapshot tests of what users read: a fixture's findings, rendered by the terminal reporter.

Each buggy fixture's findings are rendered exactly as ``nndoctor`` prints them (the terminal
reporter's finding blocks: severity, code, name, ``file:line``, message, evidence, fix), colour
off, 100 columns, and compared with a file under ``tests/snapshots/<family>/``. A changed word
fails the test with a unified diff; accepting the change is one command::

    NNDOCTOR_UPDATE_SNAPSHOTS=1 python -m pytest -n 3 -p no:cacheprovider -q
    # or: python -m pytest --snapshot-update ...

A missing snapshot is written (with a warning) on a developer's machine and fails under CI
(``CI=true``), where a silently created file would prove nothing.

What is masked, and why (everything else, every word and every deterministic number, is kept):

- absolute paths: the fixture's own folder is removed (``train.py:12``, as relative to the
  fixture dir; also its form relative to the working directory, which messages use); the test's
  temporary folder and ``tempfile.gettempdir()`` become ``<tmp>/``, the repository ``<repo>/``,
  site-packages ``<site-packages>/``, the Python install ``<python>/``, the home folder ``~/``.
  They differ between machines, checkouts and xdist workers. Recorded tracebacks keep theirs
  (``local_paths=False``): those are fixed in the recorded file.
- the 8 random characters of a ``tempfile`` name (``tmpXXXXXXXX``): differ on every run.
- memory addresses (``0x7f3a...`` from a repr): differ on every run.
- process ids (``pid 12345``): differ on every run.
- per check, the numbers it measures from the clock or the machine (``Masks``: seconds, shares
  of step time, free memory, a port the OS picked), in the ``MEASURED`` table beside the test
  that runs the fixture, each with its reason.

Masks apply to the finding's text *before* it is rendered, so the line wrapping in the snapshot
is the wrapping of the masked text and never depends on how long a path was on this machine.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import sysconfig
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nndoctor.core.findings import Finding, Location
from nndoctor.report.terminal import render_findings_text

SNAPSHOTS = Path(__file__).parent / "snapshots"
REPO = Path(__file__).resolve().parent.parent
WIDTH = 100
UPDATE_ENV = "NNDOCTOR_UPDATE_SNAPSHOTS"
UPDATE_COMMAND = f"{UPDATE_ENV}=1 python -m pytest -n 3 -p no:cacheprovider -q  (or add --snapshot-update)"

Mask = tuple[str, str]  # (regular expression, replacement)

# Values that change on every run whatever the fixture (see the module docstring).
COMMON_MASKS: tuple[Mask, ...] = (
    (r"\b0x[0-9a-fA-F]{6,}\b", "0x<addr>"),
    (r"\bpid[ =:]?\d+\b", "pid <pid>"),
    # tempfile.mkdtemp()/mkstemp() names: 'tmp' and 8 random characters (same length kept).
    (r"(<tmp>/tmp)[a-z0-9_]{8}\b", r"\1XXXXXXXX"),
)
MEASURED = "<measured>"


@dataclasses.dataclass(frozen=True)
class Masks:
    """What one check's text measures (wall-clock time, free memory): masked in its snapshot.

    ``text``: regex masks on the message and fix; ``evidence``: keys whose values are measured
    (shown as ``<measured>``); ``rendered``: masks on the rendered header line (never wrapped),
    for a severity that a timing check lowers to info when its measurement is borderline;
    ``dropped_items``: evidence list items (full match) that belong to the test harness, not to
    the user's program (the frames of pytest and xdist above an in-process run)."""

    text: tuple[Mask, ...] = ()
    evidence: tuple[str, ...] = ()
    rendered: tuple[Mask, ...] = ()
    dropped_items: tuple[str, ...] = ()
    why: str = ""


NO_MASKS = Masks()


class SnapshotCreated(UserWarning):
    """A snapshot did not exist and was written: review it and commit it."""


def _truthy(value: str | None) -> bool:
    return bool(value) and value.strip().lower() not in ("0", "false", "no", "off")


def update_requested() -> bool:
    return _truthy(os.environ.get(UPDATE_ENV))


def in_ci() -> bool:
    return _truthy(os.environ.get("CI"))


# -- normalization --------------------------------------------------------------------------
def _roots(base: Path | None, extra_roots: Iterable[tuple[str | os.PathLike, str]]) -> list[tuple[str, str]]:
    """Path prefixes to replace, longest first (a fixture dir lies inside the repository)."""
    roots: list[tuple[str, str]] = []
    if base is not None:
        roots.append((str(base), ""))
        # Messages name the user's files relative to the working directory, as a user sees them.
        roots.append((os.path.relpath(base), ""))
    roots += [(str(path), label) for path, label in extra_roots]
    roots.append((str(REPO), "<repo>/"))
    for key in ("purelib", "platlib"):
        roots.append((sysconfig.get_paths()[key], "<site-packages>/"))
    roots.append((tempfile.gettempdir(), "<tmp>/"))
    roots.append((sys.exec_prefix, "<python>/"))
    roots.append((sys.prefix, "<python>/"))
    roots.append((str(Path.home()), "~/"))
    expanded: list[tuple[str, str]] = []
    for path, label in roots:
        for variant in {path, os.path.realpath(path)}:
            if len(variant) > 1:
                expanded.append((variant.rstrip(os.sep), label))
    return sorted(expanded, key=lambda item: len(item[0]), reverse=True)


class Normalizer:
    """Masks what legitimately varies between machines and runs in a finding's text."""

    def __init__(self, base: Path | None = None, masks: Masks = NO_MASKS,
                 extra_roots: Iterable[tuple[str | os.PathLike, str]] = (), *, local_paths: bool = True) -> None:
        # A root is replaced where a path starts (not inside a longer one): its files, or the
        # folder itself. A recorded traceback names the paths of the machine that recorded it,
        # fixed in its file: ``local_paths=False`` leaves them alone (this machine's home or
        # temporary folder must not mask them here and not elsewhere).
        roots = _roots(base, extra_roots) if local_paths else []
        self.roots = [(re.compile(r"(?<![\w.~/-])" + re.escape(path) + r"(?:/|(?![\w.-]))"), label)
                      for path, label in roots]
        self.masks = [(re.compile(pattern), replacement) for pattern, replacement in (*COMMON_MASKS, *masks.text)]
        if not local_paths:
            # The recorded paths lie under the recording machine's checkout (/work/main), which
            # the report shows relative to the working directory when the suite runs from there:
            # both spellings are kept as recorded.
            self.masks.insert(0, (re.compile(r"(?<![\w./~-])tests/fixtures/"), "/work/main/tests/fixtures/"))
        self.measured = set(masks.evidence)
        self.dropped = [re.compile(pattern) for pattern in masks.dropped_items]
        self.rendered = [(re.compile(pattern, re.MULTILINE), replacement) for pattern, replacement in masks.rendered]

    def text(self, value: str) -> str:
        for pattern, label in self.roots:
            value = pattern.sub(lambda m, label=label: label if m.group(0).endswith("/") else
                                (label.rstrip("/") or "."), value)
        for pattern, replacement in self.masks:
            value = pattern.sub(replacement, value)
        return value

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.value(v) for v in value if not self._dropped(v))
        if isinstance(value, (set, frozenset)):
            return sorted((self.value(v) for v in value), key=str)
        return value

    def _dropped(self, item: Any) -> bool:
        return isinstance(item, str) and any(p.fullmatch(item) for p in self.dropped)

    def finding(self, finding: Finding) -> Finding:
        location = finding.location
        if location is not None:
            location = Location(self.text(location.path), location.line)
        return dataclasses.replace(
            finding,
            name=self.text(finding.name),
            message=self.text(finding.message),
            fix=self.text(finding.fix),
            location=location,
            evidence={self.text(str(k)): MEASURED if k in self.measured else self.value(v)
                      for k, v in finding.evidence.items()},
        )

    def rendered_text(self, text: str) -> str:
        for pattern, replacement in self.rendered:
            text = pattern.sub(replacement, text)
        return text


def render(findings: Iterable[Finding], normalizer: Normalizer) -> str:
    """The finding blocks as the terminal reporter prints them, masked, at a fixed width."""
    return normalizer.rendered_text(render_findings_text([normalizer.finding(f) for f in findings], width=WIDTH))


# -- comparison -----------------------------------------------------------------------------
def snapshot_path(name: str) -> Path:
    return SNAPSHOTS / f"{name}.txt"


def compare(name: str, actual: str, *, update: bool | None = None, ci: bool | None = None,
            root: Path = SNAPSHOTS) -> str:
    """Compare ``actual`` with the stored snapshot ``name``; return what happened
    ("same", "updated", "created"); raise ``SnapshotMismatch`` with a diff otherwise."""
    update = update_requested() if update is None else update
    ci = in_ci() if ci is None else ci
    path = root / f"{name}.txt"
    shown = _shown(path)
    if not path.exists():
        if ci and not update:
            raise SnapshotMismatch(
                f"snapshot {shown} does not exist. Under CI a missing snapshot is an error: "
                f"create it on your machine with\n    {UPDATE_COMMAND}\nreview it and commit it.")
        _write(path, actual)
        if not update:
            warnings.warn(SnapshotCreated(f"new snapshot {shown}: review it and commit it"), stacklevel=3)
        return "created"
    expected = path.read_text(encoding="utf-8")
    if expected == actual:
        return "same"
    if update:
        _write(path, actual)
        return "updated"
    diff = "".join(difflib.unified_diff(
        expected.splitlines(keepends=True), actual.splitlines(keepends=True),
        fromfile=f"{shown} (stored)", tofile=f"{shown} (this run)"))
    raise SnapshotMismatch(
        f"what users read changed for {name}:\n{diff}\n"
        f"If the new text is intended, update the snapshots with\n    {UPDATE_COMMAND}")


class SnapshotMismatch(AssertionError):
    """The rendered text differs from the stored snapshot (or the snapshot is missing in CI)."""


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def assert_findings_snapshot(name: str, findings: Iterable[Finding], *, source: str,
                             base: Path | None = None, masks: Masks = NO_MASKS,
                             extra_roots: Iterable[tuple[str | os.PathLike, str]] = (),
                             local_paths: bool = True) -> None:
    """Render ``findings`` (masked) under a one-line header naming where they came from, and
    compare with ``tests/snapshots/<name>.txt``."""
    findings = list(findings)
    assert findings, f"snapshot {name}: no findings to render"
    text = f"# {source}\n\n" + render(findings, Normalizer(base, masks, extra_roots, local_paths=local_paths))
    try:
        compare(name, text)
        failure = None
    except SnapshotMismatch as error:
        failure = str(error)
    if failure is not None:  # outside the except block: the diff alone, no chained traceback
        import pytest

        pytest.fail(failure, pytrace=False)
