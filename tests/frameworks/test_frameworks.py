"""Conformance on the frameworks users actually train with (issue 11, "Trust on real users' code").

Each program in ``programs/`` is a tiny, offline training run built on Hugging Face Trainer,
accelerate, PyTorch Lightning, timm, torch.compile, L-BFGS, layer-wise training or Hogwild,
mostly adapted from the frameworks' own tutorials and examples. They run in this process
through the engine, on the CPU, one thread, in a temporary working directory:

- ``correct_*.py`` must end ``completed`` with optimizer steps counted, no internal error,
  and no finding at warning or error level;
- ``buggy_*.py`` carry ``# expect: CODE`` on the offending line: CODE must fire there, both
  with every check enabled and with that check alone.

A framework that is not installed skips its programs (CI installs them all: the ``dev`` extra).
Known false alarms, misses and crashes that another branch fixes are listed in
``KNOWN_FAILURES``: such a test reports xfail while those are its only problems.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from nndoctor.core.findings import Severity
from tests.conftest import expected_lines, run_script

PROGRAMS = Path(__file__).parent / "programs"

# Optional frameworks: a program importing one that is not installed is skipped.
FRAMEWORKS = ("transformers", "accelerate", "lightning", "timm")


@dataclass(frozen=True)
class KnownFailure:
    """A false alarm, miss or crash another branch is fixing: the test keeps asserting the
    correct behaviour, and reports xfail only while every problem it sees is one of these
    symptoms (anything else still fails). The integrator deletes the entry after the merge."""

    reason: str
    symptoms: frozenset[str]  # finding codes, "crashed", "no steps", "missed CODE"


# Every program passes since the trust-runtime and distributed work was merged: a new known
# failure goes here with its symptoms until it is fixed.
KNOWN_FAILURES: dict[str, KnownFailure] = {}
# Tens of seconds of CPU each: inductor compiles C++ kernels, mp.spawn starts two interpreters,
# Trainer runs 80 and 192 steps of a tiny BERT twice (all checks, then the marked one).
SLOW = {"correct_torch_compile_static", "correct_torch_compile_dynamic", "correct_hogwild",
        "buggy_hf_trainer_labels_permuted", "buggy_hf_trainer_glue_shuffled_labels"}


def _packages(path: Path) -> list[str]:
    source = path.read_text()
    needed = [name for name in FRAMEWORKS if re.search(rf"^(from|import) {name}\b", source, re.MULTILINE)]
    if "TrainingArguments" in source and "accelerate" not in needed:
        needed.append("accelerate")  # transformers' Trainer runs on accelerate
    return needed


def _params(pattern: str) -> list:
    params = []
    for path in sorted(PROGRAMS.glob(pattern)):
        marks = [pytest.mark.slow] if path.stem in SLOW else []
        params.append(pytest.param(path, id=path.stem, marks=marks))
    return params


@pytest.fixture
def framework_run(monkeypatch, tmp_path, inductor_cache):
    """Offline, on the CPU, one thread, files written only under a temporary directory (and
    Inductor's compiled kernels in the tests' shared compile cache: tests/conftest.py)."""
    for name, value in {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true", "CUDA_VISIBLE_DEVICES": "",
        "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    environment = dict(os.environ)  # programs set variables too (PL_GLOBAL_SEED, HF_HUB_OFFLINE)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only contend on a shared 2-core runner
    try:
        yield run_script
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environment)
        _reset_accelerate()


def _reset_accelerate() -> None:
    """accelerate keeps one process-wide state; each program starts from a fresh one, as in its own process."""
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()


def _describe(report) -> str:
    lines = [f"{f.severity.name} {f.code} {f.location}: {f.message}" for f in report.findings]
    lines += [f"internal error {e.where}: {e.error}" for e in report.internal_errors]
    return "\n".join(lines) + (f"\n{report.traceback}" if report.traceback else "")


def _judge(program: Path, problems: list[str], details: str) -> None:
    """Pass when there is no problem; xfail when all are a known failure's symptoms; else fail."""
    if not problems:
        return
    known = KNOWN_FAILURES.get(program.stem)
    if known is not None and set(problems) <= known.symptoms:
        pytest.xfail(known.reason)
    pytest.fail(f"{program.name}: {', '.join(problems)}\n{details}")


@pytest.mark.parametrize("program", _params("correct_*.py"))
def test_correct_framework_program_is_silent(program, framework_run):
    for package in _packages(program):
        pytest.importorskip(package)
    report = framework_run(program)
    problems = [] if report.status == "completed" else ["crashed"]
    problems += [] if report.steps > 0 else ["no steps"]
    problems += ["internal error"] * bool(report.internal_errors)
    problems += sorted({f.code for f in report.findings if f.severity >= Severity.WARNING})
    _judge(program, problems, _describe(report))


@pytest.mark.parametrize("program", _params("buggy_*.py"))
def test_planted_bug_is_caught_at_its_line(program, framework_run):
    for package in _packages(program):
        pytest.importorskip(package)
    expected = expected_lines(program)
    assert expected, f"{program.name} has no '# expect: CODE' line"
    problems, details = [], []
    for select in ((), tuple(expected)):
        report = framework_run(program, select=select)
        details.append(f"-- checks: {', '.join(select) or 'all'}\n{_describe(report)}")
        problems += [] if report.status == "completed" else ["crashed"]
        problems += ["internal error"] * bool(report.internal_errors)
        for code, lines in expected.items():
            fired = {f.location.line for f in report.by_code(code)
                     if f.location and f.location.path.endswith(program.name)}
            if not fired & lines:
                problems.append(f"missed {code}")
    _judge(program, sorted(set(problems)), "\n".join(details))
