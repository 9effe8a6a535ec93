"""The pieces around the codemods, without running a script: hunks, which files may be edited,
the --verify bookkeeping (with stand-in re-runs), and the JSON and SARIF outputs."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from nndoctor.commands.fix.cli import fix_files
from nndoctor.commands.fix.edit import (
    ROLLED_BACK,
    SUGGESTION,
    VERIFIED,
    apply_hunks,
    hunks_between,
    map_line,
)
from nndoctor.commands.fix.plan import plan_edits, refusal
from nndoctor.core.findings import Finding, Location, Report, Severity
from nndoctor.report.sarif import sarif_log

SCHEMA = Path(__file__).parents[1] / "report" / "schemas" / "sarif-schema-2.1.0.json"

SCRIPT = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.zeros(8)), batch_size=4)
model = nn.Linear(2, 2)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-2)
for x, y in loader:
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
"""


def finding(code: str, line: int, path: str, severity: Severity = Severity.WARNING) -> Finding:
    return Finding(code, code.lower(), severity, f"{code} message", f"{code} fix", Location(path, line))


def test_hunks_compose_and_map_lines():
    old = "a\nb\nc\nd\n"
    new = "a\nx\nb\nc\nD\n"
    hunks = list(hunks_between(old, new))
    assert apply_hunks(old, hunks) == new
    assert [map_line(n, hunks) for n in (1, 2, 3, 4)] == [1, 3, 4, 5]
    assert hunks[-1].char_offset == old.index("d") and hunks[-1].char_length == 2


def test_library_and_outside_files_are_never_edited(tmp_path):
    inside = tmp_path / "proj" / "train.py"
    inside.parent.mkdir()
    inside.write_text("x = 1\n")
    assert refusal(str(inside), str(tmp_path / "proj"), []) is None
    lib = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "pkg" / "mod.py"
    lib.parent.mkdir(parents=True)
    lib.write_text("x = 1\n")
    assert "installed library" in refusal(str(lib), str(tmp_path), [str(lib)])
    outside = tmp_path / "elsewhere.py"
    outside.write_text("x = 1\n")
    assert "outside the project" in refusal(str(outside), str(tmp_path / "proj"), [])
    assert refusal(str(outside), str(tmp_path / "proj"), [str(outside)]) is None  # named on the command line


def _planned(tmp_path, *, unsafe=False):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    report = Report(command=["train.py"], steps=2, findings=[
        finding("D105", 8, str(script)), finding("O109", 7, str(script)), finding("O101", 10, str(script))])
    return script, report, plan_edits(report, project_root=str(tmp_path), named=[str(script)], unsafe=unsafe)


def test_unsafe_fix_is_only_a_suggestion_without_unsafe_fixes(tmp_path):
    _, _, edits = _planned(tmp_path)
    by_code = {e.code: e for e in edits}
    assert by_code["O109"].status == SUGGESTION and "--unsafe-fixes" in by_code["O109"].reason
    assert by_code["D105"].status != SUGGESTION and by_code["O101"].status != SUGGESTION
    _, _, edits = _planned(tmp_path, unsafe=True)
    assert {e.code: e for e in edits}["O109"].status != SUGGESTION


def test_diff_only_writes_nothing(tmp_path):
    script, report, edits = _planned(tmp_path)
    shown = []

    class Stream:
        def write(self, text):
            shown.append(text)

    fix_files(edits, report, write=False, verify=False, keep_backup=True, rerun=None, stream=Stream())
    assert script.read_text() == SCRIPT
    assert "+    optimizer.zero_grad()" in "".join(shown) and "shuffle=True" in "".join(shown)
    assert not list(tmp_path.glob("*.bak"))


def test_verify_rolls_back_the_edit_whose_finding_stays(tmp_path):
    script, report, edits = _planned(tmp_path)
    runs = []

    def rerun(paths):
        # The stand-in doctor: O101 is gone once zero_grad is in the file; D105 never goes away.
        text = script.read_text()
        runs.append(text)
        lines = text.splitlines()
        findings = [finding("D105", lines.index("for x, y in loader:") + 1, str(script))]
        if "zero_grad" not in text:
            findings.append(finding("O101", lines.index("    loss.backward()") + 1, str(script)))
        return Report(command=["train.py"], steps=2, findings=findings)

    fix_files(edits, report, write=True, verify=True, keep_backup=True, rerun=rerun)
    status = {e.code: e for e in edits}
    assert status["O101"].status == VERIFIED
    assert status["D105"].status == ROLLED_BACK and "still reported" in status["D105"].reason
    final = script.read_text()
    assert "optimizer.zero_grad()" in final and "shuffle=True" not in final
    assert (tmp_path / "train.py.nndoctor.bak").read_text() == SCRIPT
    assert len(runs) == 4  # together, each alone, then the survivors together


def test_verify_rolls_back_an_edit_that_brings_a_new_warning(tmp_path):
    script, report, edits = _planned(tmp_path)

    def rerun(paths):
        text = script.read_text()
        findings = [finding("X999", 1, str(script))] if "shuffle=True" in text else []
        if "zero_grad" not in text:
            findings.append(finding("O101", 10, str(script)))
        return Report(command=["train.py"], steps=2, findings=findings)

    fix_files(edits, report, write=True, verify=True, keep_backup=False, rerun=rerun)
    status = {e.code: e for e in edits}
    assert status["D105"].status == ROLLED_BACK and "X999" in status["D105"].reason
    assert status["O101"].status == VERIFIED
    assert not (tmp_path / "train.py.nndoctor.bak").exists()


def test_json_edits_and_sarif_fixes_validate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, report, edits = _planned(tmp_path, unsafe=True)
    report.edits = edits
    data = json.loads(json.dumps(report.to_json("0")))
    codes = {e["code"]: e for e in data["edits"]}
    assert codes["D105"]["range"] == {"start_line": 5, "end_line": 5}
    assert codes["O109"]["safety"] == "unsafe" and codes["D105"]["safety"] == "safe"
    assert codes["D105"]["applied"] is False and codes["D105"]["verified"] is False
    log = sarif_log(report)
    jsonschema.validate(log, json.loads(SCHEMA.read_text()), cls=jsonschema.Draft4Validator)
    fixes = {r["ruleId"]: r.get("fixes") for r in log["runs"][0]["results"]}
    change = fixes["D105"][0]["artifactChanges"][0]
    assert change["artifactLocation"]["uri"].endswith("train.py")
    region = change["replacements"][0]["deletedRegion"]
    assert SCRIPT[region["charOffset"]:region["charOffset"] + region["charLength"]].startswith("loader = DataLoader(")
    assert "shuffle=True" in change["replacements"][0]["insertedContent"]["text"]
    # no "edits" key outside nndoctor fix
    assert "edits" not in Report().to_json("0")


def test_missing_libcst_is_a_clear_usage_error(monkeypatch, capsys, tmp_path):
    import sys

    from nndoctor.cli import main

    monkeypatch.setitem(sys.modules, "libcst", None)  # what an uninstalled package looks like to import
    script = tmp_path / "train.py"
    script.write_text("print('not run')\n")
    assert main(["fix", "--isolated", str(script)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'nndoctor[fix]'" in err and "not run" not in err


def test_interrupted_verification_restores_the_files(tmp_path):
    import pytest

    script, report, edits = _planned(tmp_path)

    def rerun(paths):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fix_files(edits, report, write=True, verify=True, keep_backup=True, rerun=rerun)
    assert script.read_text() == SCRIPT
    assert all(e.status in (ROLLED_BACK, SUGGESTION) for e in edits)


def test_checks_doc_says_when_nndoctor_fix_can_edit_it(capsys):
    from nndoctor.cli import main

    main(["checks", "O101"])
    assert "`nndoctor fix --verify SCRIPT` can make this edit" in capsys.readouterr().out
    main(["checks", "O109"])
    assert "--unsafe-fixes" in capsys.readouterr().out
    main(["checks", "M103"])
    assert "nndoctor fix" not in capsys.readouterr().out
