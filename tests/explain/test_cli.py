"""``nndoctor explain [FILE|-]``: explanations, honest unknowns, exit statuses, JSON."""

from __future__ import annotations

import io
import json

from nndoctor.cli import main
from tests.conftest import FIXTURES

RECORDED = FIXTURES / "crash" / "recorded"

UNKNOWN = '''Traceback (most recent call last):
  File "/home/me/proj/train.py", line 12, in <module>
    run(config)
  File "/home/me/proj/train.py", line 8, in run
    raise KeyError("lr_schedule")
KeyError: 'lr_schedule'
'''


def test_explains_a_saved_log(capsys):
    status = main(["explain", str(RECORDED / "E108_out_of_memory.txt")])
    out = capsys.readouterr().out
    assert status == 0
    assert "E108 out-of-memory" in out and "E108_out_of_memory.py:7" in out
    assert "256.00 GiB" in out


def test_unknown_error_is_reported_honestly_with_its_user_frame(tmp_path, capsys):
    log = tmp_path / "log.txt"
    log.write_text(UNKNOWN)
    status = main(["explain", str(log)])
    out = capsys.readouterr().out
    assert status == 1
    assert "no known cause" in out and "/home/me/proj/train.py:8" in out
    assert 'raise KeyError("lr_schedule")' in out
    assert "error   E" not in out  # no explanation guessed
    assert main(["explain", "--fail-on", "never", str(log)]) == 0


def test_reads_standard_input_and_writes_json(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO((RECORDED / "E120_invalid_device_ordinal.txt").read_text() + UNKNOWN))
    out_json = tmp_path / "r.json"
    status = main(["explain", "-", "--json", str(out_json), "--quiet"])
    data = json.loads(out_json.read_text())
    assert status == 1
    assert [f["code"] for f in data["findings"]] == ["E120"]
    assert data["extra"]["unexplained"][0]["type"] == "KeyError"
    assert data["extra"]["tracebacks"] == 2
    assert capsys.readouterr().out == ""


def test_select_limits_the_explanations(tmp_path, capsys):
    status = main(["explain", "--ignore", "E108", str(RECORDED / "E108_out_of_memory.txt")])
    assert status == 1 and "no known cause" in capsys.readouterr().out


def test_text_without_errors_and_missing_file(tmp_path, capsys):
    log = tmp_path / "clean.txt"
    log.write_text("epoch 1 loss 0.5\nepoch 2 loss 0.4\n")
    assert main(["explain", str(log)]) == 0
    assert "no Python traceback" in capsys.readouterr().out
    assert main(["explain", str(tmp_path / "missing.txt")]) == 2
    assert "can't read" in capsys.readouterr().err


def test_notebook_argparse_output_is_explained(tmp_path, capsys):
    log = tmp_path / "cell.txt"
    log.write_text("usage: ipykernel_launcher.py [-h] [--lr LR]\n"
                   "ipykernel_launcher.py: error: unrecognized arguments: -f "
                   "/root/.local/share/jupyter/runtime/kernel-1a2b.json\n"
                   "An exception has occurred, use %tb to see the full traceback.\n\nSystemExit: 2\n")
    assert main(["explain", str(log)]) == 0
    out = capsys.readouterr().out
    assert "E127 notebook-argv" in out and "parse_args(args=[])" in out
