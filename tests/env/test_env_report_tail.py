"""``nndoctor env`` delivers through the report tail every command shares: output formats,
SARIF, HTML, ``--quiet``, ``--ignore`` and the project configuration (ignore, per-file-ignores).

The facts are constructed (a GPU machine with a CPU-only PyTorch: V102, an error) so each
test runs the whole command in-process without the framework probes' child processes; the
last tests run the real ``collect`` with only its slow readers replaced, to show that an
ignored V109 starts no crash-probe child."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from nndoctor.cli import main
from nndoctor.commands.env import collect as collect_module
from nndoctor.commands.env.checks import EnvFacts
from nndoctor.commands.env.frameworks import FrameworkFacts
from nndoctor.commands.env.nvidia import DriverInfo, Gpu
from nndoctor.commands.env.tf_triton import TfTritonFacts

SCHEMA = Path(__file__).parents[1] / "report" / "schemas" / "sarif-schema-2.1.0.json"
H100 = Gpu(index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-1", memory_total_mib=81559,
           memory_used_mib=10, utilization_percent=0, compute_capability="9.0")


def _cpu_torch_on_a_gpu_machine(probe_tf_triton: bool = True) -> EnvFacts:
    driver = DriverInfo(present=True, source="nvidia-smi", driver_version="550.54", cuda_version="12.4", gpus=[H100])
    torch = FrameworkFacts("torch", installed=True, importable=True, version="2.5.1+cpu",
                           facts={"cuda_build": None, "device_count": 0, "arch_list": []})
    return EnvFacts(driver=driver, frameworks={"torch": torch}, companions={"tensorboard": "2.17"})


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with a file that shadows the standard library (R102, a warning) and
    constructed facts with a CPU-only PyTorch on a GPU machine (V102, an error)."""
    monkeypatch.setattr("nndoctor.commands.env.cli.collect", _cpu_torch_on_a_gpu_machine)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "random.py").write_text("x = 1\n")
    monkeypatch.chdir(folder)  # no pyproject.toml above tmp_path has a [tool.nndoctor] table
    return folder


def _env(folder: Path, *options: str) -> int:
    return main(["env", "--dir", str(folder), *options])


def test_plain_text_shows_the_facts_then_the_findings(project, capsys):
    assert _env(project) == 1
    out = capsys.readouterr().out
    assert out.index("NVIDIA driver 550.54 (supports CUDA 12.4), 1 GPU(s)") < out.index("V102 cpu-only-build")
    assert "R102" in out and "random.py" in out


def test_output_format_json_puts_the_report_alone_on_stdout(project, capsys):
    assert _env(project, "--output-format", "json") == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # nothing but the JSON
    assert sorted(f["code"] for f in report["findings"]) == ["R102", "V102"]
    assert report["extra"]["environment"]["driver"]["gpus"][0]["name"] == H100.name
    assert "NVIDIA driver" not in captured.out + captured.err


def test_concise_and_quiet(project, capsys):
    assert _env(project, "--output-format", "concise") == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and any("V102" in line for line in lines) and any("R102" in line for line in lines)
    assert _env(project, "--quiet") == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_sarif_and_html_files(project, tmp_path, capsys):
    sarif, html = tmp_path / "env.sarif", tmp_path / "env.html"
    assert _env(project, "--sarif", str(sarif), "--html", str(html)) == 1
    log = json.loads(sarif.read_text())
    jsonschema.validate(log, json.loads(SCHEMA.read_text()), cls=jsonschema.Draft4Validator)
    assert sorted(r["ruleId"] for r in log["runs"][0]["results"]) == ["R102", "V102"]
    page = html.read_text()
    assert "V102" in page and "cpu-only-build" in page
    assert "V102 cpu-only-build" in capsys.readouterr().out  # the terminal report is still printed


def test_ignore_on_the_command_line_drops_the_finding_and_its_exit_status(project, capsys):
    assert _env(project, "--ignore", "V102", "--output-format", "json") == 0
    assert [f["code"] for f in json.loads(capsys.readouterr().out)["findings"]] == ["R102"]


def test_select_selects_the_shadowing_check_too(project, capsys):
    # Before the shared tail, R102 was reported under --select V1 (only --ignore reached it).
    assert _env(project, "--select", "V1", "--output-format", "json") == 1
    assert [f["code"] for f in json.loads(capsys.readouterr().out)["findings"]] == ["V102"]


def test_project_configuration_ignore_and_per_file_ignores(project, monkeypatch, capsys):
    # Found from --dir upward, not from the working directory.
    monkeypatch.chdir(project.parent)
    # ``ignore`` may name any catalog code (one file serves every command): M101 is no error for env.
    (project / "pyproject.toml").write_text(
        '[tool.nndoctor]\nignore = ["V102", "M101"]\n\n[tool.nndoctor.per-file-ignores]\n"random.py" = ["R102"]\n')
    assert _env(project, "--output-format", "json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["findings"] == []
    assert [s["code"] for s in report["suppressed"]] == ["R102"]
    assert "random.py" in report["suppressed"][0]["reason"]
    # --isolated reads no file: both findings are back.
    assert _env(project, "--isolated", "--output-format", "json") == 1
    assert sorted(f["code"] for f in json.loads(capsys.readouterr().out)["findings"]) == ["R102", "V102"]


def test_unknown_code_in_the_configuration_is_a_usage_error(project, capsys):
    (project / "pyproject.toml").write_text('[tool.nndoctor]\nignore = ["Q999"]\n')
    assert _env(project) == 2
    assert "unknown check code" in capsys.readouterr().err


# -- V109's probe child ------------------------------------------------------------------------

@pytest.fixture
def at_risk_pair(monkeypatch):
    """The real ``collect`` with its slow readers replaced: an at-risk TensorFlow/triton pair in
    the metadata, no driver, no framework probes, no packages; ``start_probe`` records its calls."""
    started: list[str] = []

    def start_probe():
        started.append("import tensorflow; import triton")
        return None  # the probe "could not start": V109 stays a warning

    def versions():
        return TfTritonFacts(tf_distribution="tensorflow", tf_version="2.20.0", triton_version="3.7.0",
                             global_flags_file=True)

    monkeypatch.setattr(collect_module, "read_versions", versions)
    monkeypatch.setattr(collect_module, "start_probe", start_probe)
    monkeypatch.setattr(collect_module, "probe_frameworks", dict)
    monkeypatch.setattr(collect_module, "query_driver", DriverInfo)
    monkeypatch.setattr(collect_module, "companion_versions", dict)
    monkeypatch.setattr(collect_module, "installed_distributions", dict)
    return started


@pytest.mark.parametrize("ignored", [None, "V109", "tensorflow-triton-crash", "V1"])
def test_an_ignored_v109_starts_no_probe_child(ignored, at_risk_pair, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    options = ["--ignore", ignored] if ignored else []
    status = _env(tmp_path, *options, "--output-format", "json")
    codes = [f["code"] for f in json.loads(capsys.readouterr().out)["findings"]]
    if ignored is None:
        assert at_risk_pair == ["import tensorflow; import triton"] and codes == ["V109"]
    else:
        assert at_risk_pair == [] and "V109" not in codes
    assert status == 0  # V109 without a confirmed crash is a warning


def test_v109_ignored_in_the_configuration_starts_no_probe_child(at_risk_pair, tmp_path, monkeypatch, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.nndoctor]\nignore = ["V109"]\n')
    monkeypatch.chdir(tmp_path)
    assert _env(tmp_path, "--output-format", "json") == 0
    assert at_risk_pair == []
    assert json.loads(capsys.readouterr().out)["extra"]["environment"]["tensorflow_triton"]["tf_version"] == "2.20.0"


def test_selecting_other_checks_skips_the_probe_too(at_risk_pair, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert _env(tmp_path, "--select", "V102") == 0
    assert at_risk_pair == []
