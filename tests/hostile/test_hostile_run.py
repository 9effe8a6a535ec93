"""Hostile scripts under ``nndoctor run``: abrupt endings (SIGTERM, os._exit), os.chdir, their own
sys.excepthook, training threads hitting --max-steps, closed or replaced standard streams, and
crashes inside DataLoader workers. Each ends in bounded time with its documented exit status and
a valid JSON report."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from nndoctor.cli import main
from nndoctor.core.engine import Session
from nndoctor.core.findings import Report
from nndoctor.core.tracebacks import strip_own_frames
from nndoctor.report import render_json, render_text
from nndoctor.run.cli import exit_status
from nndoctor.run.runner import Target, run_target
from tests import childproc
from tests.conftest import run_script

RAW_CONTROLS = {chr(c) for c in range(0x20) if chr(c) not in "\n\t"} | {"\x7f"}

# A tiny training loop that says "ready" once it has taken optimizer steps, then keeps training
# until stopped. argv[1] picks how it treats SIGTERM.
TRAIN_UNTIL_STOPPED = textwrap.dedent('''
    import os, signal, sys, time
    import torch
    mode = sys.argv[1]
    stop = False
    def graceful(signum, frame):
        global stop
        stop = True
    def restore_default(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    print("handler before:", repr(signal.getsignal(signal.SIGTERM)), flush=True)
    if mode == "graceful":
        signal.signal(signal.SIGTERM, graceful)
    elif mode == "restore-default":
        signal.signal(signal.SIGTERM, restore_default)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while not stop:
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        step += 1
        if step == 3:
            print("ready", flush=True)
        if mode == "exit" and step == 3:
            os._exit(7)
        time.sleep(0.01)
    print("graceful stop after SIGTERM", flush=True)
''')


def _spawn(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    script = tmp_path / "train_until_stopped.py"
    script.write_text(TRAIN_UNTIL_STOPPED)
    out = tmp_path / f"{mode}.json"
    # The child starts with the default SIGHUP and SIGTERM, as from a terminal, whatever this
    # test process inherited: a suite started under nohup ignores SIGHUP, exec keeps SIG_IGN,
    # and the child then rightly ignores it too (test_ignored_signals_stay_ignored_for_the_programs_the_script_starts).
    saved = {signum: signal.signal(signum, signal.SIG_DFL) for signum in (signal.SIGHUP, signal.SIGTERM)
             if signal.getsignal(signum) is signal.SIG_IGN}
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "nndoctor", "run", "--json", str(out), str(script), mode],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
            env=childproc.child_env(),
        )
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    return process, out


def _wait_for_line(process: subprocess.Popen, expected: str, timeout: float = 120) -> list[str]:
    lines: list[str] = []
    timeout = childproc.scaled(timeout)
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=1):
                continue
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.strip() == expected:
                return lines
    raise AssertionError(f"the script never printed {expected!r} (printed {lines})") from \
        childproc.explain_timeout(process, timeout, process.args)


def _finish(process: subprocess.Popen, since: float, limit: float = 60) -> tuple[str, str]:
    """Wait for the process (bounded), check its terminal output is clean; (stdout, stderr)."""
    stdout, err = childproc.communicate(process, limit)
    assert time.monotonic() - since < childproc.scaled(limit)
    assert not RAW_CONTROLS & set(err) and "Traceback" not in err, err
    return stdout, err


def _assert_sound(report: Report, status: str, exit_code: int, since: float, limit: float = 60) -> None:
    """Bounded time, the documented exit status, a valid JSON report, a clean terminal report."""
    assert time.monotonic() - since < childproc.scaled(limit)
    assert report.status == status, report.traceback
    assert exit_status(report, None) == exit_code
    assert json.loads(render_json(report))["status"] == status
    assert not RAW_CONTROLS & set(render_text(report))


# -- 3. SIGTERM and os._exit still leave a report ------------------------------------------------
@pytest.mark.e2e
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_write_a_terminated_report_then_die_of_the_signal(signum, tmp_path):
    process, out = _spawn(tmp_path, "plain")
    before = _wait_for_line(process, "ready")
    assert "handler before: <Handlers.SIG_DFL: 0>" in before[0]  # the script sees python's default, not ours
    sent = time.monotonic()
    process.send_signal(signum)
    _, err = _finish(process, sent, limit=60)
    assert process.returncode == -signum, err  # killed by the signal, as without nndoctor (128+N in a shell)
    data = json.loads(out.read_text())
    assert data["status"] == "terminated" and data["steps"] >= 3
    assert data["extra"]["signal"] == signal.Signals(signum).name
    assert "· terminated after" in err


@pytest.mark.e2e
def test_scripts_own_sigterm_handler_is_called_and_the_run_ends_as_it_decides(tmp_path):
    process, out = _spawn(tmp_path, "graceful")
    _wait_for_line(process, "ready")
    process.send_signal(signal.SIGTERM)
    stdout, err = _finish(process, time.monotonic())
    assert "graceful stop after SIGTERM" in stdout
    assert process.returncode == 0, err
    data = json.loads(out.read_text())
    assert data["status"] == "completed" and data["extra"]["signal"] == "SIGTERM"


@pytest.mark.e2e
def test_handler_restoring_the_default_still_gets_a_report(tmp_path):
    process, out = _spawn(tmp_path, "restore-default")
    _wait_for_line(process, "ready")
    process.send_signal(signal.SIGTERM)
    _, err = _finish(process, time.monotonic())
    assert process.returncode == -signal.SIGTERM, err
    assert json.loads(out.read_text())["status"] == "terminated" and "· terminated after" in err


@pytest.mark.e2e
def test_os_exit_writes_the_report_first_and_keeps_the_code(tmp_path):
    started = time.monotonic()
    process, out = _spawn(tmp_path, "exit")
    _, err = _finish(process, started, limit=180)
    assert process.returncode == 7, err
    data = json.loads(out.read_text())
    assert data["status"] == "completed" and data["exit_code"] == 7
    assert data["extra"]["ended_by"] == "os._exit(7)" and data["steps"] == 3
    assert "nndoctor ·" in err


@pytest.mark.e2e
def test_a_raw_fork_that_runs_on_does_not_overwrite_the_report(tmp_path):
    script = tmp_path / "raw_fork.py"
    script.write_text(textwrap.dedent('''
        import os, time
        import torch
        if os.fork() == 0:
            time.sleep(1.0)          # the child outlives the parent and runs to the end of the script
        else:
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(3):
                opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
    '''))
    out = tmp_path / "r.json"
    started = time.monotonic()
    # capture_output waits for the child too: it holds the same pipes until it exits.
    result = childproc.run([sys.executable, "-m", "nndoctor", "run", "--json", str(out), str(script)],
                           timeout=180, cwd=tmp_path)
    assert time.monotonic() - started < 180
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("nndoctor ·") == 1, result.stderr  # one report, the parent's
    assert json.loads(out.read_text())["steps"] == 3


def test_signal_api_is_virtualised_and_restored_in_process(tmp_path):
    """In-process: the script's own SIGTERM handler runs (nndoctor's is chained, not in the way),
    SIG_IGN is honoured, and nndoctor's process gets its handler back afterwards."""
    seen = tmp_path / "seen.json"
    script = tmp_path / "own_handler.py"
    script.write_text(textwrap.dedent(f'''
        import json, os, signal
        calls = []
        before = signal.getsignal(signal.SIGTERM)
        previous = signal.signal(signal.SIGTERM, lambda s, f: calls.append(s))
        os.kill(os.getpid(), signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGTERM)
        json.dump({{"before": repr(before), "previous": repr(previous), "calls": calls,
                    "now": repr(signal.getsignal(signal.SIGTERM))}}, open({str(seen)!r}, "w"))
    '''))
    delivered: list[Report] = []
    handler_before = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    report = run_target(Target(str(script), []), Session(), deliver=delivered.append)
    _assert_sound(report, "completed", 0, started)
    assert not delivered
    data = json.loads(seen.read_text())
    assert data == {"before": repr(handler_before), "previous": repr(handler_before),
                    "calls": [int(signal.SIGTERM)], "now": "<Handlers.SIG_IGN: 1>"}
    assert signal.getsignal(signal.SIGTERM) == handler_before
    assert report.extra["signal"] == "SIGTERM"


def test_ignored_signals_stay_ignored_for_the_programs_the_script_starts(tmp_path):
    """nohup ignores SIGHUP, and a script may ignore SIGTERM: exec'd children inherit SIG_IGN
    under python, so they must under nndoctor (a handler of ours would be reset to SIG_DFL)."""
    seen = tmp_path / "seen.json"
    script = tmp_path / "spawns.py"
    script.write_text(textwrap.dedent(f'''
        import json, signal, subprocess, sys
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        probe = "import signal; print(int(signal.getsignal(signal.SIGHUP)), int(signal.getsignal(signal.SIGTERM)))"
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60).stdout
        json.dump({{"here": repr(signal.getsignal(signal.SIGHUP)), "child": out.split()}}, open({str(seen)!r}, "w"))
    '''))
    hup_before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        started = time.monotonic()
        report = run_target(Target(str(script), []), Session(), deliver=lambda report: None)
        _assert_sound(report, "completed", 0, started)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, hup_before)
    data = json.loads(seen.read_text())
    assert data == {"here": "<Handlers.SIG_IGN: 1>", "child": ["1", "1"]}  # 1 = SIG_IGN


def test_forked_children_get_pythons_own_sigterm_and_os_exit(tmp_path):
    """A DataLoader worker or multiprocessing child stopped with terminate() dies at once of
    SIGTERM, as without nndoctor, and writes no report of its own."""
    # The default handler, whatever an earlier test in this worker left (ray.init's exits 15).
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        _forked_child_is_terminated(tmp_path)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _forked_child_is_terminated(tmp_path):
    seen = tmp_path / "seen.json"
    script = tmp_path / "forks.py"
    script.write_text(textwrap.dedent(f'''
        import json, multiprocessing as mp, os, signal, time
        def child(queue):
            queue.put([repr(signal.getsignal(signal.SIGTERM)), type(os._exit).__name__])
            time.sleep(60)
        if __name__ == "__main__":
            ctx = mp.get_context("fork")
            queue = ctx.Queue()
            process = ctx.Process(target=child, args=(queue,))
            process.start()
            inherited = queue.get(timeout=60)
            started = time.monotonic()
            process.terminate()
            process.join(30)
            json.dump({{"inherited": inherited, "exitcode": process.exitcode,
                        "seconds": time.monotonic() - started}}, open({str(seen)!r}, "w"))
    '''))
    delivered: list[Report] = []
    handler_before = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    report = run_target(Target(str(script), []), Session(), deliver=delivered.append)
    _assert_sound(report, "completed", 0, started, limit=90)
    assert not delivered
    data = json.loads(seen.read_text())
    assert data["inherited"] == [repr(handler_before), "builtin_function_or_method"]
    assert data["exitcode"] == -signal.SIGTERM and data["seconds"] < 20


# -- 4. relative --json paths resolve against the starting directory ----------------------------
CHDIR_AND_TRAIN = textwrap.dedent('''
    import os, sys
    import torch
    os.makedirs("elsewhere", exist_ok=True)
    os.chdir("elsewhere")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
''')


@pytest.mark.parametrize("command", [["run"], ["perf", "--steps", "1", "--warmup", "0"]])
def test_relative_json_path_survives_the_scripts_chdir(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(CHDIR_AND_TRAIN)
    started = time.monotonic()
    status = main([*command, "--json", "reports/rel.json", "train.py"])
    assert time.monotonic() - started < 120
    assert status == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "reports" / "rel.json").read_text())["steps"] >= 1
    assert not (tmp_path / "elsewhere" / "reports").exists()


# -- 5. the script's sys.excepthook --------------------------------------------------------------
def test_scripts_excepthook_is_called_like_python_does(tmp_path):
    seen = tmp_path / "hook.json"
    script = tmp_path / "hooked.py"
    script.write_text(textwrap.dedent(f'''
        import json, sys
        def hook(kind, value, tb):
            json.dump({{"kind": kind.__name__, "value": str(value),
                        "first_frame": tb.tb_frame.f_code.co_filename}}, open({str(seen)!r}, "w"))
        sys.excepthook = hook
        raise RuntimeError("boom")
    '''))
    saved = sys.excepthook
    started = time.monotonic()
    report = run_script(script)
    _assert_sound(report, "crashed", 3, started)
    assert json.loads(seen.read_text()) == {"kind": "RuntimeError", "value": "boom", "first_frame": str(script)}
    assert sys.excepthook is saved


def test_a_failing_excepthook_is_reported_in_one_line(tmp_path, capsys):
    script = tmp_path / "bad_hook.py"
    script.write_text("import sys\n"
                      "def hook(*args):\n    raise KeyError('hook \\x1b[2J broke')\n"
                      "sys.excepthook = hook\nraise RuntimeError('boom')\n")
    started = time.monotonic()
    report = run_script(script)
    _assert_sound(report, "crashed", 3, started)
    err = capsys.readouterr().err
    assert "nndoctor: the script's sys.excepthook raised KeyError" in err and "\x1b" not in err


# -- 6. --max-steps inside a training thread ----------------------------------------------------
def test_max_steps_in_a_training_thread_stops_cleanly(tmp_path, capfd):
    script = tmp_path / "threaded.py"
    script.write_text(textwrap.dedent('''
        import threading
        import torch
        def train():
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(1000):
                opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
        worker = threading.Thread(target=train)
        worker.start()
        worker.join(60)
    '''))
    hook = threading.excepthook
    started = time.monotonic()
    report = run_script(script, max_steps=2)
    _assert_sound(report, "stopped", 0, started)
    assert report.steps == 2
    err = capfd.readouterr().err
    assert "Exception in thread" not in err and "StopRun" not in err and "Traceback" not in err
    assert threading.excepthook is hook


# -- 7. closed or replaced standard streams -----------------------------------------------------
@pytest.mark.e2e
def test_closed_stdout_and_none_stderr_do_not_crash_or_redirect_the_report(tmp_path):
    script = tmp_path / "streams.py"
    script.write_text(textwrap.dedent(f'''
        import os, sys
        import torch
        print("script output", flush=True)
        sys.stdout.close()
        sys.stderr = None
        log = open({str(tmp_path / "log.txt")!r}, "w")
        os.dup2(log.fileno(), 2)       # the script sends descriptor 2 to its log file
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(2):
            opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
    '''))
    started = time.monotonic()
    result = childproc.run([sys.executable, "-m", "nndoctor", "run", "--json", "-", str(script)],
                           timeout=180, cwd=tmp_path)
    assert time.monotonic() - started < 180
    assert result.returncode == 0, result.stderr
    assert not RAW_CONTROLS & set(result.stderr)
    # With --json - the JSON owns stdout; the script's own output goes to stderr (issue 17).
    assert "script output" in result.stderr
    data = json.loads(result.stdout)  # --json - reached nndoctor's own stdout
    assert data["status"] == "completed" and data["steps"] == 2
    assert "nndoctor ·" in result.stderr and "Traceback" not in result.stderr  # the report reached our stderr
    assert "nndoctor ·" not in (tmp_path / "log.txt").read_text()


def test_streams_are_given_back_after_the_script_replaces_them(tmp_path):
    script = tmp_path / "replaces.py"
    script.write_text("import io, sys\nsys.stdout = io.StringIO()\nsys.stderr = None\n")
    out, err = sys.stdout, sys.stderr
    started = time.monotonic()
    report = run_script(script)
    _assert_sound(report, "completed", 0, started)
    assert sys.stdout is out and sys.stderr is err


# -- 9. nndoctor's own frames stay out of the user's traceback ----------------------------------
def test_dataloader_worker_crash_shows_no_nndoctor_frames(tmp_path, monkeypatch):
    script = tmp_path / "worker_crash.py"
    script.write_text(textwrap.dedent('''
        import torch
        from torch.utils.data import DataLoader, Dataset
        class Broken(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, i):
                if i == 5:
                    raise ValueError("bad sample \\x1b[31mred")
                return torch.zeros(3)
        if __name__ == "__main__":
            for batch in DataLoader(Broken(), batch_size=2, num_workers=1):
                pass
    '''))
    started = time.monotonic()
    report = run_script(script)
    _assert_sound(report, "crashed", 3, started)
    nndoctor_dir = os.path.dirname(os.path.abspath(__import__("nndoctor").__file__))
    assert "Original Traceback" in report.traceback and "worker_crash.py" in report.traceback
    assert nndoctor_dir not in report.traceback and "explain/instrument.py" not in report.traceback
    assert nndoctor_dir in report.extra["traceback_full"]  # the whole story stays in the JSON
    json.dumps(report.to_json("test"))
    text = render_text(report, width=300)
    assert nndoctor_dir not in text and not RAW_CONTROLS & set(text)
    monkeypatch.setenv("NNDOCTOR_DEBUG", "1")
    assert nndoctor_dir in render_text(report, width=300)


def test_strip_own_frames_keeps_user_frames_and_messages():
    own = os.path.join(os.path.dirname(os.path.abspath(__import__("nndoctor").__file__)), "explain", "instrument.py")
    text = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n'
        "    main()\n"
        f'  File "{own}", line 53, in fetch\n'
        "    return original(self, index)\n"
        "           ^^^^^^^^^^^^^^^^^^^^^\n"
        '  File "train.py", line 9, in __getitem__\n'
        "    raise ValueError('x')\n"
        "ValueError: x\n"
    )
    assert strip_own_frames(text) == (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n'
        "    main()\n"
        '  File "train.py", line 9, in __getitem__\n'
        "    raise ValueError('x')\n"
        "ValueError: x\n"
    )


def test_internal_deadline_bounds_a_stuck_delivery(monkeypatch):
    """A report delivery that hangs (a lock held by the interrupted code) delays the ending by
    at most the deadline, never forever."""
    from nndoctor.run import signals

    monkeypatch.setattr(signals, "DELIVERY_DEADLINE_S", 0.5)
    release = threading.Event()
    guard = signals.AbruptEndGuard(Session(), lambda status, code: release.wait(30))
    started = time.monotonic()
    guard._deliver("terminated", None)
    assert time.monotonic() - started < 5 and guard.ended
    release.set()


def test_terminated_exit_status_is_what_a_shell_shows_for_the_signal():
    assert exit_status(Report(status="terminated"), None) == 128 + signal.SIGTERM
    assert exit_status(Report(status="terminated", extra={"signal": "SIGHUP"}), None) == 128 + signal.SIGHUP


def test_os_exit_delivers_for_the_script_but_not_for_nndoctors_own_code():
    from nndoctor.run import signals

    ended: list[tuple[str, int | None]] = []
    exits: list[int] = []
    guard = signals.AbruptEndGuard(Session(), lambda status, code: ended.append((status, code)))
    guard._real_exit = exits.append  # never leave the test process
    own = os.path.join(os.path.dirname(os.path.abspath(__import__("nndoctor").__file__)), "watchdog.py")
    namespace: dict = {}
    exec(compile("def stop(guard):\n    guard._os_exit(124)\n", own, "exec"), namespace)
    namespace["stop"](guard)  # a watchdog of nndoctor's that already wrote its own report
    assert ended == [] and exits == [124]
    guard._os_exit(7)  # the script
    assert ended == [("completed", 7)] and exits == [124, 7]
