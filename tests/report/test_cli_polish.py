"""CLI polish: checks --json and piped tables, explain --help's exit statuses, --quiet
everywhere, the demo's path, hanging indents."""

from __future__ import annotations

import json

import pytest

from nndoctor.cli import main
from nndoctor.core.findings import Finding, Location, Report, Severity


def test_checks_json_and_full_names_when_piped(capsys):
    assert main(["checks", "--json", "-", "--scope", "run"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"code", "name", "severity", "command", "summary", "fix", "documentation"} <= set(data[0])
    assert main(["checks", "--scope", "run"]) == 0  # capsys: not a terminal
    out = capsys.readouterr().out
    longest = max((c["name"] for c in data), key=len)
    assert longest in out and "…" not in out and "┃" not in out
    assert len(out.splitlines()) == len(data)
    assert main(["checks", "M101", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "eval-in-train-mode"


def test_explain_help_states_its_real_exit_statuses(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 every error in the text was explained" in text
    assert "1 some error has no known cause" in text
    assert "fail-on" in text and "(default: error)" not in text


def test_explain_exits_0_on_an_explained_error_as_its_help_says(tmp_path, capsys):
    log = tmp_path / "log.txt"
    log.write_text('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
                   "    out = model(x)\nRuntimeError: mat1 and mat2 shapes cannot be multiplied "
                   "(4x10 and 20x5)\n")
    assert main(["explain", "--json", "-", "--isolated", str(log)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [f["severity"] for f in data["findings"]] == ["error"]  # an error finding, and exit 0


@pytest.mark.parametrize("command", [["run"], ["demo"], ["explain"], ["data", "x"], ["perf"],
                                     ["ckpt", "inspect", "x"]])
def test_every_command_takes_quiet_and_the_output_options(command, capsys):
    with pytest.raises(SystemExit):
        main([*command[:1], *command[1:2], "--help"] if command[0] != "ckpt" else ["ckpt", "inspect", "--help"])
    text = capsys.readouterr().out
    for option in ("--quiet", "--output-format", "--sarif", "--html", "--config", "--isolated"):
        assert option in text, (command, option)


def test_demo_names_its_script_as_users_know_it():
    from nndoctor.commands.demo.cli import SCRIPT, SHOWN_PATH, show_bundled_paths

    report = Report()
    report.add(Finding(code="D101", name="unnormalized-input", severity=Severity.ERROR, message="m",
                       fix="f", location=Location(SCRIPT, 73)))
    show_bundled_paths(report)
    assert str(report.findings[0].location) == f"{SHOWN_PATH}:73" == "nndoctor/commands/demo/buggy_train.py:73"


def test_wrapped_lines_keep_a_hanging_indent_and_whole_words():
    from nndoctor.report import render_text

    report = Report(command=["train.py"])
    words = " ".join(f"word{i:02d}" for i in range(40))
    report.add(Finding(code="M101", name="eval-in-train-mode", severity=Severity.ERROR, message=words,
                       fix=words, location=Location("train.py", 3)))
    lines = render_text(report, width=60).splitlines()
    body = [line for line in lines if "word" in line]
    assert len(body) > 4
    assert all(line.startswith("    ") for line in body)
    assert all(token.startswith(("word", "fix:")) for line in body for token in line.split())


def test_no_color_means_no_escape_codes_at_all(monkeypatch):
    import io

    from rich.console import Console

    from nndoctor.report.terminal import no_color_options

    monkeypatch.setenv("NO_COLOR", "1")
    buffer = io.StringIO()
    Console(file=buffer, force_terminal=True, **no_color_options()).print("[bold]a[/bold] [dim red]b[/dim red]")
    assert buffer.getvalue() == "a b\n"
    monkeypatch.delenv("NO_COLOR")
    buffer = io.StringIO()
    Console(file=buffer, force_terminal=True, **no_color_options()).print("[bold]a[/bold]")
    assert "\x1b[" in buffer.getvalue()
