"""``nndoctor explain`` stays silent on what correct training programs print.

The correct fixture programs (tests/fixtures/correct, the Keras ones on the TensorFlow backend,
the DDP one under torchrun) ran as users run them, without nndoctor; their stdout and stderr are recorded in
tests/explain/correct_outputs/ by ``record_correct_outputs.py``. A correct run's output holds
start-up lines, framework warnings, progress and metrics, and no cause: ``explain`` must find
no error and name no code in any of them. A Keras program is also run live (slow), and the DDP one's
output under nndoctor is explained in tests/distributed/test_torchrun.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nndoctor.commands.explain.cli import explain_all
from tests.explain.record_correct_outputs import (
    OUTPUTS,
    ROOT,
    correct_programs,
    recording_name,
    run,
)

RECORDINGS = sorted(OUTPUTS.glob("*.txt"))


def read_recording(path: Path) -> tuple[str, str]:
    header, _, output = path.read_text(encoding="utf-8").partition("\n---\n")
    program = next(line.split(":", 1)[1].strip() for line in header.splitlines() if line.startswith("# program:"))
    return program, output


def test_the_correct_programs_outputs_are_recorded():
    assert len(RECORDINGS) >= 40
    recorded = {read_recording(path)[0] for path in RECORDINGS}
    assert all((ROOT / program).is_file() for program in recorded), "a recording names a program that is gone"
    # Every kind of correct program is there: PyTorch, Keras on TensorFlow, DDP with gloo.
    assert {Path(p).parent.name for p in recorded} == {"correct", "keras", "distributed"}


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_explain_finds_nothing_in_a_correct_programs_output(path):
    program, output = read_recording(path)
    result = explain_all(output)
    assert result.findings == [], [(f.code, f.message) for f in result.findings]
    assert result.unexplained == [], [c.text for c in result.unexplained]
    assert result.tracebacks == 0, program


# The DDP program's live check is in tests/distributed/test_torchrun.py (its clean run's output).
LIVE = ("tests/fixtures/keras/correct_fit_validation.py",)


@pytest.mark.slow
@pytest.mark.parametrize("relative", LIVE, ids=lambda p: Path(p).stem)
def test_explain_finds_nothing_in_a_live_correct_run(relative):
    # The recordings could go stale; one Keras-on-TensorFlow program (TensorFlow's start-up log
    # lines) runs again here, as the recorder runs it (the DDP one: tests/distributed/test_torchrun.py).
    program = ROOT / relative
    assert program in correct_programs() and (OUTPUTS / recording_name(program)).is_file()
    done = run(program)
    assert done.returncode == 0, done.stdout[-2000:]
    result = explain_all(done.stdout)
    assert result.findings == [] and result.unexplained == [], done.stdout[-2000:]
