"""Output formats: concise, GitHub Actions commands, SARIF 2.1.0 (validated against the
official OASIS schema shipped in tests/report/schemas), and the CLI wiring of all of them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from nndoctor.core.findings import Finding, Location, Report, Severity, Suppressed
from nndoctor.report.concise import render_concise
from nndoctor.report.github import github_line, render_github
from nndoctor.report.sarif import sarif_log
from tests import childproc

SCHEMA = Path(__file__).parent / "schemas" / "sarif-schema-2.1.0.json"


def _report(tmp_path) -> Report:
    report = Report(command=["train.py"], steps=5)
    report.add(Finding(code="M101", name="eval-in-train-mode", severity=Severity.ERROR,
                       message="evaluated in training mode, 100%: bad,\nreally", fix="call model.eval()",
                       location=Location(str(tmp_path / "train.py"), 12), evidence={"x": float("nan")}))
    report.add(Finding(code="P101", name="dataloader-bottleneck", severity=Severity.WARNING,
                       message="slow loader", fix="more workers", location=None))
    report.suppressed.append(Suppressed(
        Finding(code="D101", name="unnormalized-input", severity=Severity.ERROR, message="pixels",
                fix="normalise", location=Location(str(tmp_path / "train.py"), 3)),
        "comment at train.py:3"))
    return report


def test_concise_is_one_line_per_finding(tmp_path):
    lines = render_concise(_report(tmp_path)).splitlines()
    assert lines == [
        f"{tmp_path / 'train.py'}:12: M101 [error] evaluated in training mode, 100%: bad, really",
        "-: P101 [warning] slow loader",
    ]


def test_github_commands_are_escaped_and_relative(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    report = _report(tmp_path)
    line = github_line(report.findings[0])
    assert line == ("::error file=train.py,line=12,title=M101 eval-in-train-mode::"
                    "evaluated in training mode, 100%25: bad,%0Areally%0AFix: call model.eval()")
    assert render_github(report).splitlines()[1] == "::warning title=P101 dataloader-bottleneck::slow loader%0AFix: more workers"


def test_sarif_validates_against_the_2_1_0_schema(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = json.loads(json.dumps(sarif_log(_report(tmp_path))))
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft4Validator.check_schema(schema)
    jsonschema.validate(log, schema, cls=jsonschema.Draft4Validator)
    run = log["runs"][0]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert set(rules) == {"M101", "P101", "D101"}
    assert "## Why is this bad?" in rules["M101"]["help"]["markdown"]
    results = run["results"]
    first = results[0]
    assert first["ruleId"] == "M101" and first["level"] == "error"
    assert first["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "train.py", "uriBaseId": "%SRCROOT%"}, "region": {"startLine": 12}}
    assert results[1]["level"] == "warning" and "locations" not in results[1]
    assert results[2]["suppressions"] == [{"kind": "inSource", "justification": "comment at train.py:3"}]


def test_schema_rejects_a_broken_log():
    """The shipped schema really constrains: a result without a message is refused."""
    schema = json.loads(SCHEMA.read_text())
    broken = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": [{"ruleId": "M101"}]}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft4Validator)


def nndoctor(*args, cwd=None, env=None):
    import os

    full_env = {**os.environ, **(env or {})}
    return childproc.run([sys.executable, "-m", "nndoctor", *args], cwd=cwd, timeout=300, env=full_env)


SCRIPT = '''\
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
print("script output")
for step in range(5):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()  # nndoctor: ignore[O102]
value = 1  # nndoctor: ignore[M101]
torch.save(model, "model.pt")
'''


@pytest.mark.e2e
def test_run_with_config_comment_sarif_and_github(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.nndoctor]\nfail-on = "warning"\nsarif = "out/nndoctor.sarif"\nreport-unused-ignores = true\n'
        '[tool.nndoctor.per-file-ignores]\n"train.py" = ["C103"]\n')
    (tmp_path / "train.py").write_text(SCRIPT)
    result = nndoctor("run", "--output-format", "github", "--json", "-", "train.py", cwd=tmp_path,
                      env={"GITHUB_WORKSPACE": str(tmp_path)})
    assert result.returncode == 1, result.stderr  # M106 (error) remains; fail-on from the file
    assert "script output" in result.stderr  # the script's stdout moved aside for the JSON
    stdout = result.stdout
    json_text, _, github = stdout.partition("\n}\n")
    data = json.loads(json_text + "\n}\n")
    assert [f["code"] for f in data["findings"]] == ["M106"]
    assert {s["code"]: s["reason"] for s in data["suppressed"]} == {
        "O102": "comment at train.py:13",
        "C103": f"per-file-ignores 'train.py' in {tmp_path / 'pyproject.toml'}"}
    assert data["extra"]["unused_suppressions"] == [{"path": "train.py", "line": 14, "codes": ["M101"]}]
    lines = github.splitlines()
    assert lines[0].startswith("::error file=train.py,line=13,title=M106 model-not-updating::")
    assert lines[1].startswith("::notice file=train.py,line=14,title=unused suppression::")
    sarif = json.loads((tmp_path / "out" / "nndoctor.sarif").read_text())
    jsonschema.validate(sarif, json.loads(SCHEMA.read_text()), cls=jsonschema.Draft4Validator)
    assert len(sarif["runs"][0]["results"]) == 3


@pytest.mark.e2e
def test_run_text_summary_counts_suppressed_and_unknown_option_shows_run_usage(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    result = nndoctor("run", "--isolated", "--html", "out/report.html", "--tensorboard", "tb", "train.py",
                      cwd=tmp_path, env={"NO_COLOR": "1"})
    assert "· 1 suppressed" in result.stderr
    assert "\x1b" not in result.stderr
    page = (tmp_path / "out" / "report.html").read_text()
    data = json.loads(page.split('id="nndoctor-data">', 1)[1].split("</script>", 1)[0])
    assert data["history"]["loss"]["steps"] == [0, 1, 2, 3, 4]  # the history was recorded for --html
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    bogus = nndoctor("run", "--bogus", "train.py", cwd=tmp_path)
    assert bogus.returncode == 2
    assert bogus.stderr.startswith("usage: nndoctor run [OPTIONS]")
    assert "unrecognized arguments: --bogus" in bogus.stderr
