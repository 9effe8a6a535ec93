"""An error no explanation matches: "no known cause" and the user's line, never "No problems
found." under a traceback; long lists on the terminal end with "… and N more"."""

from __future__ import annotations

import io

from nndoctor.commands.explain.cli import explain_text, show
from nndoctor.core.findings import Report
from nndoctor.report import render_text
from nndoctor.report.capping import cap_items, cap_lists
from tests.conftest import run_script


def test_run_crash_with_no_known_cause_names_the_users_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nconfig = {}\nlr = config['lr']\n")
    report = run_script(script, select=["E"])
    text = render_text(report, width=200)
    assert "No problems found" not in text
    assert f"no known cause KeyError  {script}:3" in text
    assert f"raised from your code at {script}:3 `lr = config['lr']`" in text


def test_run_that_completes_still_says_no_problems_found(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("x = 1\n")
    assert "No problems found." in render_text(run_script(script, select=["E"]))


def test_dataset_error_with_a_large_batch_prints_a_capped_index_list(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Items(Dataset):\n"
        "    def __len__(self):\n"
        "        return 600\n"
        "    def __getitem__(self, i):\n"
        "        return [0.0] * 3 if i != 599 else [][i]\n"
        "for batch in DataLoader(Items(), batch_size=600):\n"
        "    pass\n")
    report = run_script(script, select=["E"])
    assert report.status == "crashed" and "IndexError" in report.traceback
    text = render_text(report, width=200)
    assert "… and 504 more]" in text  # 512 indices in the note, 8 shown
    assert ", 100, " not in text
    assert "no known cause IndexError" in text and f"{script}:7" in text


def test_explain_uses_the_same_block():
    text = 'Traceback (most recent call last):\n  File "/home/me/t.py", line 4, in <module>\n    go()\nKeyError: \'lr\'\n'
    findings, unexplained = explain_text(text)
    out = io.StringIO()
    show(Report(command=["explain"]), unexplained, text_had_errors=True, file=out)
    assert "no known cause KeyError  /home/me/t.py:4" in out.getvalue()
    assert "raised from your code at /home/me/t.py:4 `go()`" in out.getvalue()


def test_cap_items_and_lists():
    assert cap_items([str(i) for i in range(10)], 3) == ["0", "1", "2", "… and 7 more"]
    assert cap_items(["a", "b"], 3) == ["a", "b"]
    assert cap_lists("idx " + str(list(range(20)))) == "idx [0, 1, 2, 3, 4, 5, 6, 7, … and 12 more]"
    assert cap_lists("shape [3, 224, 224] and [1, 2, 3, 4, 5, 6, 7, 8]") == "shape [3, 224, 224] and [1, 2, 3, 4, 5, 6, 7, 8]"
