"""Hostile output paths and hostile text: nndoctor's reports never replace special files, never
hang on a FIFO, fail cleanly on paths that cannot hold a report, and never let user text drive
the terminal (control sequences, rich markup)."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from nndoctor.cli import main
from nndoctor.core.findings import Finding, InternalError, Location, Report, Severity
from nndoctor.report import render_json, render_text, write_json
from nndoctor.report.terminal import render_to
from nndoctor.util import atomic
from nndoctor.util.atomic import atomic_write_text, prepare_output_path
from nndoctor.util.errors import UsageError
from tests import childproc
from tests.conftest import FIXTURES

# Every raw control character a terminal acts on, besides the newline and tab nndoctor prints.
RAW_CONTROLS = [chr(c) for c in range(0x20) if chr(c) not in "\n\t"] + ["\x7f"] + [chr(c) for c in range(0x80, 0xA0)]
# An OSC title change, a screen clear, a colour, a bell, a backspace and a carriage return.
HOSTILE = "evil\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b1m\x08\x08\rOK [bold red]markup[/bold red]"


def _report_with_hostile_text() -> Report:
    report = Report(command=["train.py", HOSTILE], status="crashed", steps=3)
    report.traceback = f'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: {HOSTILE}\n'
    report.add(Finding(
        code="M101", name="eval-in-train-mode", severity=Severity.ERROR,
        message=f"model {HOSTILE} is evaluated in training mode",
        location=Location(f"data/{HOSTILE}.py", 7),
        evidence={"model": HOSTILE, "layers": [HOSTILE, "ok"], "nested": {HOSTILE: HOSTILE}},
        fix=f"call {HOSTILE}.eval()",
    ))
    report.internal_errors.append(InternalError(where=HOSTILE, error=f"RuntimeError: {HOSTILE}", traceback=""))
    return report


def _assert_no_raw_controls(text: str) -> None:
    found = sorted({f"U+{ord(c):04X}" for c in text if c in RAW_CONTROLS})
    assert not found, f"raw control characters reached the terminal: {found}"


# -- 2. terminal escape injection ---------------------------------------------------------------
def test_terminal_report_escapes_control_characters_and_markup_but_json_keeps_them():
    report = _report_with_hostile_text()
    text = render_text(report, json_path=f"out{HOSTILE}.json")
    _assert_no_raw_controls(text)
    assert "\\e]0;pwned\\x07" in text and "\\e[2J" in text and "\\x9b" in text and "\\r" in text
    assert "[bold red]markup[/bold red]" in text  # printed literally, not as a style
    data = json.loads(render_json(report))
    assert data["findings"][0]["message"] == f"model {HOSTILE} is evaluated in training mode"
    assert data["findings"][0]["evidence"]["model"] == HOSTILE


def test_colour_terminal_carries_only_nndoctors_own_styles():
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, force_terminal=True, color_system="truecolor", highlight=False)
    render_to(console, _report_with_hostile_text())
    out = buffer.getvalue()
    for sequence in ("\x1b]0;pwned", "\x07", "\x1b[2J", "\x08", "\r", "\x9b"):
        assert sequence not in out
    assert "[bold red]markup[/bold red]" in out


def test_hostile_module_names_from_a_real_run_are_escaped(tmp_path):
    script = tmp_path / "evil_names.py"
    script.write_text(
        "import torch\n"
        "from torch import nn\n"
        f"Evil = type({HOSTILE!r}, (nn.Module,), {{}})\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(4, 2)\n"
        f"        self.add_module({'drop' + HOSTILE.replace('.', '')!r}, nn.Dropout(0.5))\n"
        "    def forward(self, x):\n"
        "        return self.fc(x)\n"
        "model = Net()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()\n"
        "with torch.no_grad():\n"
        "    model(torch.randn(8, 4))\n"
        f"raise ValueError({HOSTILE!r})\n"
    )
    from tests.conftest import run_script

    report = run_script(script)
    assert report.status == "crashed"
    assert "M101" in report.codes(), [f.code for f in report.findings]
    m101 = report.by_code("M101")[0]
    assert "\x1b" in m101.message  # the raw name is in the finding (and the JSON) ...
    text = render_text(report, width=400)
    _assert_no_raw_controls(text)  # ... never on the terminal
    assert "(e.g. dropevil\\e]0;pwned\\x07\\e[2J" in text
    assert "ValueError: evil\\e]0;pwned\\x07" in text


# -- 1. special files are written through, never replaced ---------------------------------------
def test_dev_null_is_written_through_and_stays_a_device():
    before = os.stat("/dev/null")
    atomic_write_text("/dev/null", '{"a": 1}\n')
    write_json(Report(), "/dev/null")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert not [p for p in os.listdir("/dev") if p.startswith(".null.")]  # no temp file left beside it


def test_symlink_to_a_device_writes_through_the_link(tmp_path):
    link = tmp_path / "report.json"
    link.symlink_to("/dev/null")
    write_json(Report(), link)
    assert link.is_symlink() and os.readlink(link) == "/dev/null"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_fifo_is_written_through_to_its_reader(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    report = Report(command=["train.py"], status="completed", steps=4)
    started = time.monotonic()
    write_json(report, fifo)
    reader.join(10)
    assert time.monotonic() - started < 10
    assert json.loads(received[0])["steps"] == 4
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_fifo_without_reader_fails_in_bounded_time(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "FIFO_WAIT_S", 0.3)
    fifo = tmp_path / "nobody_reads.fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(OSError, match="no process read the FIFO"):
        write_json(Report(), fifo)
    assert time.monotonic() - started < 5
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_dev_stdout_redirected_to_a_file_gets_the_report_appended(capfd):
    # Under pytest's fd capture, descriptor 1 is a regular temporary file: /dev/stdout must not
    # be renamed over (that replaces the /dev/stdout link) nor truncated.
    print("earlier output", flush=True)
    write_json(Report(command=["x"]), "/dev/stdout")
    out = capfd.readouterr().out
    assert out.startswith("earlier output\n")
    assert json.loads(out.split("\n", 1)[1])["command"] == ["x"]
    assert os.path.islink("/dev/stdout") or not os.path.exists("/dev/stdout.tmp")


def test_dev_stdout_as_a_pipe_receives_the_json():
    code = ("from nndoctor.core.findings import Report; from nndoctor.report import write_json; "
            "write_json(Report(command=['piped']), '/dev/stdout')")
    result = childproc.run([sys.executable, "-c", code], timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["command"] == ["piped"]


def test_closed_stdout_path_is_an_error_not_a_new_file_in_dev():
    code = ("import os, sys\n"
            "from nndoctor.core.findings import Report\nfrom nndoctor.report import write_json\n"
            "os.close(1)\n"
            "try:\n    write_json(Report(), '/dev/stdout')\n"
            "except OSError as error:\n    print('refused:', error, file=sys.stderr)\n")
    result = childproc.run([sys.executable, "-c", code], timeout=60)
    assert "refused:" in result.stderr and "the stream is closed" in result.stderr, result.stderr
    assert os.path.islink("/dev/stdout")
    assert not [p for p in os.listdir("/dev") if p.startswith(".stdout.")]


def test_directory_target_is_refused_not_replaced(tmp_path):
    with pytest.raises(IsADirectoryError):
        atomic_write_text(tmp_path, "x")
    assert tmp_path.is_dir()


def test_block_device_is_refused():
    devices = [p for p in Path("/dev").iterdir() if p.exists() and stat.S_ISBLK(p.stat().st_mode)]
    if not devices:
        pytest.skip("no block device in /dev")
    with pytest.raises(UsageError, match="block device"):
        prepare_output_path(str(devices[0]))
    with pytest.raises(OSError, match="block device"):
        atomic_write_text(devices[0], "x")


def test_regular_file_is_still_replaced_atomically(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    inode = target.stat().st_ino
    write_json(Report(steps=2), target)
    assert json.loads(target.read_text())["steps"] == 2
    assert target.stat().st_ino != inode  # a new file renamed into place


def test_run_json_to_dev_null_and_a_fifo(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    script = FIXTURES / "scripts" / "never_trains.py"
    assert main(["run", "--json", "/dev/null", str(script)]) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "r.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert main(["run", "--json", str(fifo), str(script)]) == 0
    reader.join(10)
    assert json.loads(received[0])["status"] == "completed"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


# -- 8. output paths that cannot hold a report: one line, exit 2, before any work ---------------
def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder where creating a file fails, for root too (permission bits do not stop root)."""
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        fd, probe = tempfile.mkstemp(dir=folder)
    except OSError:
        return folder
    os.close(fd)
    os.unlink(probe)
    folder.chmod(0o700)
    for candidate in (Path("/sys"), Path("/proc")):
        try:
            fd, probe = tempfile.mkstemp(dir=candidate)
        except OSError:
            return candidate
        os.close(fd)
        os.unlink(probe)
    pytest.skip("no folder this user cannot write")


def _bad_paths(tmp_path: Path) -> dict[str, str]:
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("x")
    (tmp_path / "a_dir").mkdir()
    return {
        "is a directory": str(tmp_path / "a_dir"),
        "is a file, not a folder": str(a_file / "sub" / "r.json"),
        "cannot write in": str(_unwritable_folder(tmp_path) / "r.json"),
    }


def _training_marker_script(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "script_ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    return script, marker


@pytest.mark.parametrize("command", ["run", "perf", "demo", "explain", "env"])
def test_bad_output_path_is_a_one_line_usage_error_before_any_work(command, tmp_path, capsys):
    script, marker = _training_marker_script(tmp_path)
    log = tmp_path / "log.txt"
    log.write_text("Traceback (most recent call last):\nValueError: x\n")
    for expected, bad in _bad_paths(tmp_path).items():
        tail = {"run": [str(script)], "perf": [str(script)], "demo": [], "explain": [str(log)], "env": []}[command]
        started = time.monotonic()
        status = main([command, "--json", bad, *tail])
        err = capsys.readouterr().err
        assert status == 2, (command, bad, err)
        assert time.monotonic() - started < 30
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("nndoctor: error: --json"), err
        assert expected in lines[0] and "Traceback" not in err
        assert not marker.exists(), "the script must not run when its report cannot be written"
    assert os.path.isdir(tmp_path / "a_dir")


def test_prepare_output_path_makes_paths_absolute_and_keeps_dash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert prepare_output_path("-") == "-"
    assert prepare_output_path("out/r.json") == str(tmp_path / "out" / "r.json")
    assert prepare_output_path("/dev/stdout") == "/dev/stdout"
    assert not (tmp_path / "out").exists()  # checking creates nothing


def test_checks_json_path_is_checked_like_every_output_path(tmp_path, capsys):
    # `checks --json PATH` exists (issue 17): a directory is a one-line usage error, exit 2.
    assert main(["checks", "--json", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nndoctor: error: ") and "Traceback" not in err
    out = tmp_path / "catalog.json"
    assert main(["checks", "--json", str(out), "--quiet"]) == 0
    assert any(entry["code"] == "M101" for entry in json.loads(out.read_text()))


def test_bad_output_path_with_control_characters_is_printed_escaped(tmp_path, capsys):
    folder = tmp_path / "evil\x1b]0;pwned\x07\x1b[2J"
    folder.mkdir()
    script, marker = _training_marker_script(tmp_path)
    assert main(["run", "--json", str(folder), str(script)]) == 2
    err = capsys.readouterr().err
    _assert_no_raw_controls(err)
    assert "evil\\e]0;pwned\\x07\\e[2J: is a directory" in err and not marker.exists()


def test_report_that_cannot_be_written_at_the_end_is_one_line_and_not_advertised(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    script = tmp_path / "sabotage.py"
    script.write_text("import os, shutil\nshutil.rmtree('out')\nopen('out', 'w').close()\n")
    started = time.monotonic()
    assert main(["run", "--json", "out/r.json", str(script)]) == 0  # the script's own outcome
    assert time.monotonic() - started < 60
    err = capsys.readouterr().err
    assert "nndoctor: could not write out/r.json:" in err and "Traceback" not in err
    assert "JSON: out/r.json" not in err
    _assert_no_raw_controls(err)
