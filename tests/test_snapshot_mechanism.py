"""The snapshot mechanism itself (tests/snapshot.py): a changed word fails with a diff and the
update command, the update switch rewrites, a missing snapshot fails under CI, the masks keep the
rendering independent of the machine, and the text is the terminal reporter's own."""

from __future__ import annotations

import types

import pytest

from nndoctor.core.findings import Finding, Location, Report, Severity
from nndoctor.report.terminal import render_text
from tests import conftest
from tests.conftest import BUGGY, FIXTURES, expected_lines
from tests.snapshot import (
    MEASURED,
    SNAPSHOTS,
    UPDATE_ENV,
    Masks,
    Normalizer,
    SnapshotCreated,
    SnapshotMismatch,
    compare,
    render,
)


def _finding(message: str = "the loss was computed on probabilities", path: str = "/x/train.py", **kw) -> Finding:
    return Finding(code="L101", name="softmax-before-cross-entropy", severity=Severity.ERROR, message=message,
                   fix="pass the logits", location=Location(path, 12), evidence=kw or {"max_prob": 0.25})


@pytest.mark.filterwarnings("ignore::tests.snapshot.SnapshotCreated")
def test_same_text_passes_and_a_changed_word_fails_with_a_diff_and_the_update_command(tmp_path):
    assert compare("family/case", "line one\nline two\n", update=False, ci=False, root=tmp_path) == "created"
    assert compare("family/case", "line one\nline two\n", update=False, ci=False, root=tmp_path) == "same"
    with pytest.raises(SnapshotMismatch) as failure:
        compare("family/case", "line one\nline 2\n", update=False, ci=False, root=tmp_path)
    message = str(failure.value)
    assert "-line two\n" in message and "+line 2\n" in message and "@@" in message
    assert f"{UPDATE_ENV}=1" in message and "--snapshot-update" in message
    assert (tmp_path / "family" / "case.txt").read_text() == "line one\nline two\n"  # not rewritten


@pytest.mark.filterwarnings("ignore::tests.snapshot.SnapshotCreated")
def test_update_rewrites_the_file(tmp_path, monkeypatch):
    compare("case", "old\n", update=False, ci=False, root=tmp_path)
    assert compare("case", "new\n", update=True, ci=True, root=tmp_path) == "updated"
    assert (tmp_path / "case.txt").read_text() == "new\n"
    monkeypatch.setenv(UPDATE_ENV, "1")  # the environment switch, as the one command sets it
    assert compare("case", "newer\n", ci=True, root=tmp_path) == "updated"
    assert (tmp_path / "case.txt").read_text() == "newer\n"


def test_missing_snapshot_fails_under_ci_and_is_created_with_a_warning_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.delenv(UPDATE_ENV, raising=False)
    with pytest.raises(SnapshotMismatch, match="does not exist"):
        compare("new/case", "text\n", root=tmp_path)
    assert not (tmp_path / "new" / "case.txt").exists()
    monkeypatch.setenv("CI", "false")
    with pytest.warns(SnapshotCreated, match="review it and commit it"):
        assert compare("new/case", "text\n", root=tmp_path) == "created"
    assert (tmp_path / "new" / "case.txt").read_text() == "text\n"


def test_snapshot_update_option_turns_the_switch_on(monkeypatch):
    monkeypatch.delenv(UPDATE_ENV, raising=False)
    config = types.SimpleNamespace(getoption=lambda name, default=None: name == "--snapshot-update")
    conftest.pytest_configure(config)
    import os

    assert os.environ.get(UPDATE_ENV) == "1"


def test_rendering_is_the_terminal_reports_own_finding_block():
    finding = _finding(path="train.py")
    block = render([finding], Normalizer(local_paths=False))
    assert block.startswith("error   L101 softmax-before-cross-entropy  train.py:12\n")
    assert block.strip() in render_text(Report(findings=[finding]), width=100)


def test_paths_are_masked_before_wrapping(tmp_path):
    long_dir = tmp_path / ("deep" * 12)
    text = "the file {file} is read by every worker of the loader, which is slow over a network " * 2
    short = _finding(text.format(file=tmp_path / "a.pt"), path=str(tmp_path / "train.py"))
    long = _finding(text.format(file=long_dir / "a.pt"), path=str(long_dir / "train.py"))
    rendered_short = render([short], Normalizer(tmp_path))
    rendered_long = render([long], Normalizer(long_dir))
    assert str(tmp_path) not in rendered_short and str(long_dir) not in rendered_long
    # Same masked text, same line breaks, whatever the length of the real paths.
    assert rendered_short == rendered_long
    assert "train.py:12" in rendered_short and "the file a.pt is read" in rendered_short


def test_addresses_pids_temp_names_and_measured_values_are_masked_and_nothing_else(tmp_path):
    import tempfile

    temp = f"{tempfile.gettempdir()}/tmpab12_x9z/ckpt.pt"
    finding = _finding(f"<object at 0x7f3a2b1c9d40> in pid 41234 wrote {temp} after 3.27 s at step 17",
                       idle_s=3.27, steps=17)
    masks = Masks(text=((r"\d+\.\d+ s\b", "<t> s"),), evidence=("idle_s",))
    rendered = render([finding], Normalizer(tmp_path, masks))
    assert "0x<addr>" in rendered and "pid <pid>" in rendered and "<tmp>/tmpXXXXXXXX/ckpt.pt" in rendered
    assert "after <t> s at step 17" in rendered  # the deterministic number stays
    assert f"idle_s={MEASURED}; steps=17" in rendered


def test_recorded_paths_are_kept_verbatim():
    import os

    home = os.path.expanduser("~")
    finding = _finding(f"raised in {home}/project/train.py", path=f"{home}/project/train.py")
    rendered = render([finding], Normalizer(local_paths=False))
    assert f"{home}/project/train.py:12" in rendered


def _fixture_snapshot_names() -> dict[str, set[str]]:
    run = set()
    for path in BUGGY.glob("*.py"):
        for code in expected_lines(path):
            run.add(path.stem if path.stem.startswith(code) else f"{path.stem}.{code}")
    crash = {p.stem if p.stem != "train" else p.parent.name
             for p in (FIXTURES / "crash").rglob("*.py") if "gpu" not in p.parts and "distributed" not in p.parts
             # TensorFlow crash fixtures run in one subprocess (tests/explain/tf_crash_runner.py), which
             # returns JSON: their text is checked there by evidence assertions, not snapshotted yet.
             and "tensorflow" not in p.parts
             and expected_lines(p)}
    keras = {f"{p.stem}.{code}" for p in (FIXTURES / "keras").glob("buggy_*.py") for code in expected_lines(p)}
    preflight = {p.stem for p in (FIXTURES / "preflight").glob("*.py")}
    return {"run": run, "crash": crash, "keras": keras, "preflight": preflight}


@pytest.mark.parametrize("family", ["run", "crash", "keras", "preflight"])
def test_every_fixture_has_its_snapshot_and_no_snapshot_is_stale(family):
    expected = _fixture_snapshot_names()[family]
    stored = {p.stem for p in (SNAPSHOTS / family).glob("*.txt")}
    assert not expected - stored, f"fixtures without a snapshot in tests/snapshots/{family}: {sorted(expected - stored)}"
    assert not stored - expected, (f"snapshots of no fixture (renamed or deleted?) in tests/snapshots/{family}: "
                                   f"{sorted(stored - expected)}")
