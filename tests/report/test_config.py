"""Configuration discovery and precedence: [tool.nndoctor] in the nearest pyproject.toml."""

from __future__ import annotations

import argparse

import pytest

from nndoctor.cli import add_common_options
from nndoctor.core.config import apply, find_config, load_config
from nndoctor.util.errors import UsageError


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_common_options(parser)
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    apply(args, argv)
    return args


def _project(tmp_path, table: str):
    (tmp_path / "pyproject.toml").write_text(f"[project]\nname = 'x'\n\n[tool.nndoctor]\n{table}\n")
    scripts = tmp_path / "src" / "deep"
    scripts.mkdir(parents=True)
    script = scripts / "train.py"
    script.write_text("print('hi')\n")
    return script


def test_discovered_upward_from_the_script(tmp_path):
    script = _project(tmp_path, 'fail-on = "warning"\nmax-steps = 7\nselect = ["M1", "O101"]')
    args = _args([str(script)])
    assert args.fail_on == "warning"
    assert args.max_steps == 7
    assert args.select == ["M1,O101"]
    assert args.config_file.path == (tmp_path / "pyproject.toml").resolve()


def test_pyproject_without_our_table_is_skipped(tmp_path):
    script = _project(tmp_path, 'fail-on = "info"')
    (script.parent / "pyproject.toml").write_text("[tool.ruff]\nline-length = 80\n")
    assert find_config(script) == (tmp_path / "pyproject.toml").resolve()


def test_command_line_beats_the_file_and_ignore_adds(tmp_path):
    script = _project(tmp_path, 'fail-on = "info"\nignore = ["M105"]\nselect = ["M1"]\nmax-steps = 3')
    args = _args(["--fail-on", "never", "--ignore", "O102", "--select=O1", "--max-steps", "9", str(script)])
    assert args.fail_on == "never"
    assert args.max_steps == 9
    assert args.select == ["O1"]
    assert args.ignore == ["M105", "O102"]


def test_paths_in_the_file_are_relative_to_it(tmp_path):
    script = _project(tmp_path, 'sarif = "out/report.sarif"\noutput-format = "concise"')
    args = _args([str(script)])
    assert args.sarif == str(tmp_path / "out" / "report.sarif")
    assert args.output_format == "concise"


def test_isolated_and_explicit_config(tmp_path):
    script = _project(tmp_path, 'fail-on = "info"')
    assert _args(["--isolated", str(script)]).fail_on == "error"
    other = tmp_path / "ci.toml"
    other.write_text('fail-on = "warning"\n')
    assert _args(["--config", str(other), str(script)]).fail_on == "warning"
    with pytest.raises(UsageError, match="cannot be used together"):
        _args(["--config", str(other), "--isolated", str(script)])
    with pytest.raises(UsageError, match="not found"):
        _args(["--config", str(tmp_path / "missing.toml"), str(script)])


@pytest.mark.parametrize("table, message", [
    ('fail_on = "error"', "unknown key 'fail_on'"),
    ('max-steps = "ten"', "max-steps must be a positive integer"),
    ('select = ["Q999"]', "unknown check code or name: Q999"),
    ('output-format = "xml"', "output-format must be one of"),
    ('per-file-ignores = { "tests/*" = ["NOPE"] }', "unknown check code or name: NOPE"),
])
def test_bad_keys_and_values_name_the_key(tmp_path, table, message):
    script = _project(tmp_path, table)
    with pytest.raises(UsageError, match=message):
        _args([str(script)])


def test_invalid_toml_is_a_usage_error(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.nndoctor]\nselect = [\n")
    with pytest.raises(UsageError, match="invalid TOML"):
        load_config(path)
