"""The stall watchdog (R104) in a single process: report, stacks, and the run goes on."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time

import pytest

from nndoctor.run.watchdog import format_stack
from tests import childproc

# Six steps of training that stop after the third (line 15: the pause): ``time.sleep(4)`` waits
# and goes on, ``threading.Event().wait()`` waits forever.
SIX_STEPS_WITH_A_PAUSE = textwrap.dedent('''
    import {module}

    import torch
    from torch import nn

    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 2:
            {pause}
''')
PAUSING = SIX_STEPS_WITH_A_PAUSE.format(module="time", pause="time.sleep(4)")
WAITING_FOREVER = SIX_STEPS_WITH_A_PAUSE.format(module="threading", pause="threading.Event().wait()")


def _here():
    return sys._getframe()


def test_stack_marks_the_users_frames():
    text, user = format_stack(_here())
    assert any(line.startswith("  >> ") and "test_watchdog.py" in line for line in text.splitlines())
    assert user and user[-1].rsplit(":", 1)[0].endswith("test_watchdog.py")


@pytest.mark.e2e
def test_stall_is_reported_and_the_run_goes_on(tmp_path):
    script = tmp_path / "pausing.py"
    script.write_text(PAUSING)
    env = dict(os.environ)
    env.pop("NNDOCTOR_STALL_SECONDS", None)
    result = childproc.run(
        [sys.executable, "-m", "nndoctor", "run", "--stall-seconds", "1.5", "--select", "R104",
         "--json", str(tmp_path / "r.json"), str(script)],
        cwd=tmp_path, env=env, timeout=300)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "completed" and report["steps"] == 6  # it kept waiting, then finished
    (stall,) = report["findings"]
    assert stall["code"] == "R104" and stall["location"]["line"] == 15 and stall["first_step"] == 3
    assert "stalled after 3 optimizer steps" in result.stderr  # the snapshot report, printed at once
    assert ">> pausing.py:15 in <module>" in result.stderr
    assert result.returncode == 1  # R104 is an error (--fail-on error)


@pytest.mark.e2e
def test_stop_with_sigint_ignored_ends_the_run_at_once_and_says_why(tmp_path):
    # A background job of a shell without job control starts with SIGINT ignored, and Python
    # keeps it ignored: the watchdog's SIGINT cannot wake the main thread. It must say so and end
    # the process at once (not after the 60 s grace set here), with the report and exit 124.
    import signal

    script = tmp_path / "waiting.py"
    script.write_text(WAITING_FOREVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NNDOCTOR_STALL")}
    env["NNDOCTOR_STOP_GRACE"] = "60"

    def ignore_sigint():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    started = time.monotonic()
    result = childproc.run(
        [sys.executable, "-m", "nndoctor", "run", "--stall-seconds", "1.5", "--stall-action", "stop",
         "--select", "R104", "--json", str(tmp_path / "r.json"), str(script)],
        cwd=tmp_path, env=env, timeout=50, preexec_fn=ignore_sigint)
    assert result.returncode == 124, result.stderr[-2000:]
    assert time.monotonic() - started < 55  # the grace (60 s) was not waited
    assert "SIGINT is ignored in this process" in result.stderr
    assert "stuck in native code" not in result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    (stall,) = report["findings"]
    assert stall["code"] == "R104" and stall["location"]["line"] == 15 and report["status"] == "stalled"


def test_the_watchdogs_late_sigint_does_not_cut_the_closing_of_a_stopped_run():
    """A rank blocked in a collective gets the watchdog's SIGINT only when the collective
    returns — with its own error when the peer was stopped too — so the KeyboardInterrupt used
    to surface inside ``finish`` and end as nndoctor's internal error ("finish:
    KeyboardInterrupt"), the rank's report cut short. Once the watchdog stopped the run, the
    closing code absorbs it; a user's SIGINT with no stop under way still interrupts."""
    import signal

    from nndoctor.core.engine import Session
    from nndoctor.run.distributed.stall_merge import STALL_STOPPED
    from nndoctor.run.end import finish

    class LateSignal:
        subscriber_name = "late signal"
        finished = False

        def on_run_end(self, event):
            signal.raise_signal(signal.SIGINT)  # delivered now, handled at the next bytecode
            LateSignal.finished = True

    class NoInstallation:
        def uninstall(self):
            pass

    before = signal.getsignal(signal.SIGINT)
    for stopped in (True, False):
        LateSignal.finished = False
        session = Session(checks=[])
        session.subscribe(LateSignal())
        if stopped:
            session.stash[STALL_STOPPED] = True
        finish(session, NoInstallation(), "crashed", None)
        errors = [e.error for e in session.report.internal_errors]
        if stopped:
            assert errors == [] and LateSignal.finished
        else:
            assert errors == ["KeyboardInterrupt: "] and not LateSignal.finished
        assert signal.getsignal(signal.SIGINT) is before  # restored
