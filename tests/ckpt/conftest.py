"""Shared helpers for the ckpt tests: in-process CLI runs, file hashes, tiny checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))


def sha256(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err


@pytest.fixture
def run_cli(capsys):
    from nndoctor.cli import main

    def run(*argv: str) -> CliResult:
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture(autouse=True)
def _fresh_keras_names():
    # Findings quote Keras layer names, numbered per process: each test starts from the same count.
    from tests.conftest import forget_keras_names

    forget_keras_names()


@pytest.fixture
def run_json(run_cli, tmp_path, request):
    """Run a ckpt command with --json and return (exit code, parsed JSON, stdout).

    Every run that reports findings is also a snapshot test of their terminal text
    (tests/snapshots/ckpt/<test>[.<n>].txt, n counting the test's runs; tests/snapshot.py)."""
    calls = []

    def run(*argv: str):
        json_path = tmp_path / f"report_{len(list(tmp_path.glob('report_*.json')))}.json"
        result = run_cli(*argv, "--json", json_path)
        data = json.loads(json_path.read_text()) if json_path.exists() else None
        calls.append(argv)
        if data and data.get("findings"):
            _snapshot(request.node.name, len(calls) - 1, argv, data["findings"], tmp_path)
        return result.code, data, result

    return run


def _snapshot(test_name: str, index: int, argv, findings: list[dict], tmp_path: Path) -> None:
    from nndoctor.run.distributed.merge import finding_from_json
    from tests.snapshot import Normalizer, assert_findings_snapshot

    name = re.sub(r"[^\w.-]+", "-", test_name.removeprefix("test_")).strip("-") + (f".{index}" if index else "")
    normalizer = Normalizer(tmp_path, extra_roots=[(FIXTURES, "<ckpt-fixtures>/")])
    shown = " ".join(normalizer.text(str(a)) for a in argv)
    assert_findings_snapshot(f"ckpt/{name}", [finding_from_json(f) for f in findings], base=tmp_path,
                             extra_roots=[(FIXTURES, "<ckpt-fixtures>/")], source=f"nndoctor {shown}")


def codes(report: dict) -> list[str]:
    return [f["code"] for f in report["findings"]]


@pytest.fixture
def net():
    from nets import build

    model = build()
    # Non-trivial BatchNorm statistics so that "weights equal" means something.
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
                module.num_batches_tracked.fill_(7)
    return model


def nets_spec(name: str) -> str:
    return f"{FIXTURES / 'nets.py'}:{name}"
