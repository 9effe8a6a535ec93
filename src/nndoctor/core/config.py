"""Project configuration: ``[tool.nndoctor]`` in the nearest ``pyproject.toml``.

Found like ruff and pytest find theirs: from the script (or the first path) upward to the
filesystem root; the first ``pyproject.toml`` that has a ``[tool.nndoctor]`` table wins.
``--config PATH`` names the file instead (a ``pyproject.toml``, or any TOML file whose top
level, or ``[tool.nndoctor]`` table, holds the keys); ``--isolated`` ignores every file.

Precedence: an option given on the command line beats the file; the file beats the built-in
default. ``--ignore`` on the command line adds to the file's ``ignore``; ``--select`` replaces
the file's ``select`` (as in ruff). Paths in the file (``json``, ``sarif``, ``html``,
``tensorboard``) are relative to the file's folder. An unknown key is an error that names it.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nndoctor.util.errors import UsageError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

OUTPUT_FORMATS = ("text", "json", "github", "concise")
FAIL_ON_VALUES = ("error", "warning", "info", "never")


@dataclass(frozen=True)
class _Key:
    kind: str  # "codes", "choice", "int", "float", "bool", "path", "per-file"
    dest: str | None  # the argparse destination it fills when not given on the command line
    choices: tuple[str, ...] = ()


KEYS: dict[str, _Key] = {
    "select": _Key("codes", "select"),
    "ignore": _Key("codes", "ignore"),
    "fail-on": _Key("choice", "fail_on", FAIL_ON_VALUES),
    "per-file-ignores": _Key("per-file", None),
    "max-steps": _Key("int", "max_steps"),
    # Sampling: every step of the first ``full-window`` steps is fully instrumented, then
    # one step in ``sample-every``.
    "sample-every": _Key("int", None),
    # The share of the run's time sampled steps may cost before the interval widens (0: never).
    "sample-budget": _Key("float", None),
    "full-window": _Key("int", None),
    "stall-seconds": _Key("float", "stall_seconds"),
    "output-format": _Key("choice", "output_format", OUTPUT_FORMATS),
    "json": _Key("path", "json"),
    "sarif": _Key("path", "sarif"),
    "html": _Key("path", "html"),
    "tensorboard": _Key("path", "tensorboard"),
    "quiet": _Key("bool", "quiet"),
    "report-unused-ignores": _Key("bool", "report_unused_ignores"),
    # nndoctor perf: seconds for the whole run (--budget) and re-runs per change (--try-repeats).
    "budget": _Key("float", "budget"),
    "try-repeats": _Key("int", "try_repeats"),
}


@dataclass
class Config:
    """The validated ``[tool.nndoctor]`` table (empty when there is no file)."""

    path: Path | None = None
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        """The folder paths in the file are relative to (the working directory without one)."""
        return self.path.parent if self.path else Path.cwd()

    @property
    def per_file_ignores(self) -> dict[str, list[str]]:
        return dict(self.values.get("per-file-ignores", {}))

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def _table_of(path: Path, data: dict[str, Any], *, named: bool) -> dict[str, Any] | None:
    table = data.get("tool", {}).get("nndoctor") if isinstance(data.get("tool"), dict) else None
    if table is not None:
        if not isinstance(table, dict):
            raise UsageError(f"{path}: [tool.nndoctor] must be a table")
        return table
    if named and path.name != "pyproject.toml":
        return {k: v for k, v in data.items() if k != "tool"}
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as error:
        raise UsageError(f"can't read config {str(path)!r}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{path}: invalid TOML: {error}") from None


def find_config(start: str | os.PathLike[str]) -> Path | None:
    """The nearest ``pyproject.toml`` with a ``[tool.nndoctor]`` table, from ``start`` upward."""
    here = Path(start).resolve()
    if not here.is_dir():
        here = here.parent
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                data = _read_toml(candidate)
            except UsageError:
                # A broken pyproject.toml of an unrelated project further up is not ours to
                # judge, but the nearest one is: report it only if it mentions nndoctor.
                if "[tool.nndoctor" in candidate.read_text(encoding="utf-8", errors="replace"):
                    raise
                continue
            if _table_of(candidate, data, named=False) is not None:
                return candidate
    return None


def load_config(path: str | os.PathLike[str], *, named: bool = False) -> Config:
    """Read and validate the nndoctor table of ``path``."""
    path = Path(path)
    if named and not path.is_file():
        raise UsageError(f"config file {str(path)!r} not found")
    table = _table_of(path, _read_toml(path), named=named) or {}
    return Config(path=path.resolve(), values=validate(table, str(path)))


def validate(table: dict[str, Any], where: str) -> dict[str, Any]:
    """Check every key and value; normalise code lists to lists of strings."""
    values: dict[str, Any] = {}
    for key, value in table.items():
        spec = KEYS.get(key)
        if spec is None:
            raise UsageError(
                f"{where}: unknown key {key!r} in [tool.nndoctor] (known: {', '.join(KEYS)})"
            )
        values[key] = _check_value(key, spec, value, where)
    return values


def _codes(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [p.strip() for v in value for p in v.split(",") if p.strip()]
    return None


def _check_value(key: str, spec: _Key, value: Any, where: str) -> Any:
    def bad(expected: str) -> UsageError:
        return UsageError(f"{where}: [tool.nndoctor] {key} must be {expected}, not {value!r}")

    if spec.kind == "codes":
        codes = _codes(value)
        if codes is None:
            raise bad("a list of check codes or names")
        from nndoctor.catalog.table import unknown_selectors

        unknown = unknown_selectors(codes)
        if unknown:
            raise UsageError(f"{where}: [tool.nndoctor] {key}: unknown check code or name: {', '.join(unknown)}")
        return codes
    if spec.kind == "choice":
        if value not in spec.choices:
            raise bad("one of " + ", ".join(spec.choices))
        return value
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if spec.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad("a positive integer")
        return value
    if spec.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise bad("a positive number of seconds")
        return float(value)
    if spec.kind == "path":
        if not isinstance(value, str) or not value:
            raise bad("a path")
        return value
    if spec.kind == "per-file":
        if not isinstance(value, dict):
            raise bad('a table of glob = ["CODES"]')
        table = {}
        for pattern, codes in value.items():
            parsed = _codes(codes)
            if parsed is None:
                raise UsageError(f"{where}: [tool.nndoctor.per-file-ignores] {pattern!r} must list check codes")
            from nndoctor.catalog.table import unknown_selectors

            unknown = unknown_selectors(parsed)
            if unknown:
                raise UsageError(f"{where}: [tool.nndoctor.per-file-ignores] {pattern!r}: "
                                 f"unknown check code or name: {', '.join(unknown)}")
            table[pattern] = parsed
        return table
    raise AssertionError(spec.kind)  # pragma: no cover - every kind is handled above


def discovery_start(args: argparse.Namespace) -> str:
    """Where to start looking: the script, the first path or file (``env --dir``'s folder),
    else the working directory."""
    target = [t for t in (getattr(args, "target", None) or []) if t != "--"]
    if target and not getattr(args, "module", None) and target[0] != "-m":
        return target[0]
    for name in ("paths", "file", "files", "dir"):
        value = getattr(args, name, None)
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, str) and value not in ("", "-"):
            return value
    return os.getcwd()


def resolve(args: argparse.Namespace) -> Config:
    """The configuration this invocation uses (``--config``, ``--isolated`` or discovery)."""
    if getattr(args, "isolated", False):
        if getattr(args, "config", None):
            raise UsageError("--config and --isolated cannot be used together")
        return Config()
    if getattr(args, "config", None):
        return load_config(args.config, named=True)
    found = find_config(discovery_start(args))
    return load_config(found) if found else Config()


def _given_on_command_line(option: str, argv: list[str]) -> bool:
    for token in argv:
        if token == "--":
            return False
        if token == option or token.startswith(option + "="):
            return True
    return False


def apply(args: argparse.Namespace, argv: list[str]) -> Config:
    """Fill ``args`` from the configuration where the command line left an option unset.

    Keys a subcommand has no option for (``max-steps`` for ``nndoctor data``) are skipped:
    one file serves every subcommand. The Config is kept on ``args.config_file``.
    """
    config = resolve(args)
    for key, value in config.values.items():
        dest = KEYS[key].dest
        if dest is None or not hasattr(args, dest):
            continue
        given = _given_on_command_line(f"--{key}", argv)
        if key == "ignore":
            setattr(args, dest, [",".join(value), *(getattr(args, dest) or [])])
        elif given:
            continue
        elif key == "select":
            setattr(args, dest, [",".join(value)])
        elif KEYS[key].kind == "path":
            setattr(args, dest, str(config.root / value))
        else:
            setattr(args, dest, value)
    args.config_file = config
    return config


def session_options(args: argparse.Namespace) -> dict[str, Any]:
    """Sampling options for ``Session`` from the configuration (empty: the defaults)."""
    config = getattr(args, "config_file", None)
    options: dict[str, Any] = {}
    if config is not None:
        if config.get("sample-every"):
            options["sample_every"] = config.get("sample-every")
        if config.get("sample-budget") is not None:
            options["sample_budget"] = config.get("sample-budget")
        if config.get("full-window"):
            options["full_window"] = config.get("full-window")
    return options
