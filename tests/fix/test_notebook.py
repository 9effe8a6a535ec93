"""``nndoctor fix`` on a notebook: cells joined into one script and edited back cell by cell."""

from __future__ import annotations

import json

import pytest

from nndoctor.cli import main
from nndoctor.commands.fix.notebook import NotebookScript
from tests.conftest import BUGGY


def notebook(tmp_path, cells):
    path = tmp_path / "train.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def code(source, outputs=()):
    return {"cell_type": "code", "metadata": {}, "execution_count": 1, "outputs": list(outputs),
            "source": source.splitlines(keepends=True)}


def test_round_trip_keeps_magics_markdown_and_unchanged_cells(tmp_path):
    path = notebook(tmp_path, [{"cell_type": "markdown", "metadata": {}, "source": ["# Title\n"]},
                               code("%matplotlib inline\nimport torch\n"),
                               code("x = 1\nfor i in range(2):\n    y = x\n")])
    converted = NotebookScript.read(str(path))
    assert "pass  # magic" in converted.script and "%matplotlib" not in converted.script
    compile(converted.script, "nb", "exec")
    edited = converted.script.replace("    y = x\n", "    z = 0\n    y = x\n")
    assert converted.cell_diff(edited, "train.ipynb").count("+++ b/train.ipynb (cell 3)") == 1
    assert converted.write_back(edited, keep_backup=True) == [2]
    cells = json.loads(path.read_text())["cells"]
    assert cells[1]["source"] == ["%matplotlib inline\n", "import torch\n"]
    assert "".join(cells[2]["source"]) == "x = 1\nfor i in range(2):\n    z = 0\n    y = x"
    assert cells[0]["source"] == ["# Title\n"]
    assert (tmp_path / "train.ipynb.nndoctor.bak").exists()


@pytest.mark.slow
def test_fix_verify_edits_the_notebook_cell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = (BUGGY / "O101_missing_zero_grad.py").read_text().splitlines(keepends=True)
    path = notebook(tmp_path, [code("".join(lines[1:6]) + "%time x = 1\n"),
                               code("".join(lines[6:]), outputs=[{"output_type": "stream", "name": "stdout",
                                                                   "text": ["ok\n"]}])])
    out = tmp_path / "fix.json"
    main(["fix", "--verify", "--quiet", "--isolated", "--fail-on", "never", "--json", str(out), "train.ipynb"])
    report = json.loads(out.read_text())
    assert [(e["code"], e["status"], e["file"]) for e in report["edits"]] == [("O101", "verified", "train.ipynb (cell 2)")]
    cells = json.loads(path.read_text())["cells"]
    assert "    optimizer.zero_grad()\n" in cells[1]["source"]
    assert cells[1]["outputs"][0]["text"] == ["ok\n"] and cells[0]["source"][-1] == "%time x = 1\n"
    assert not list(tmp_path.glob(".*.nndoctor.py"))  # the hidden script is gone
