"""The README's ``nndoctor fix`` section shows what the tool prints today on the demo's script.

The README quotes ``nndoctor fix --verify buggy_train.py`` on a copy of the demo (the diff and the
summary lines): this runs the same command on a copy and compares, so the quoted diff cannot go
stale. Two trainings of the demo (the run and the verification), hence ``slow``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nndoctor.cli import main
from nndoctor.commands.demo.cli import SCRIPT

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_fix_block() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.index("## `nndoctor fix`")
    start = text.index("```diff\n", section) + len("```diff\n")
    return text[start:text.index("```\n", start)]


@pytest.mark.slow
def test_readme_fix_section_is_the_current_output_on_the_demo(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copy(SCRIPT, tmp_path / "buggy_train.py")
    main(["fix", "--verify", "--quiet", "--isolated", "buggy_train.py"])
    out = capsys.readouterr().out
    # The demo's own prints (its epochs' losses) come before the diff.
    shown = out[out.index("--- a/buggy_train.py"):]
    assert shown.strip() == readme_fix_block().strip()
    assert "5 of 5 edit(s) verified and written" in shown
