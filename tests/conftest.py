"""Shared test helpers: run fixture scripts in-process through the engine (no subprocess)."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import re
import signal
import sys
from pathlib import Path

import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")

# Tests run as from a terminal: a background command of a shell without job control (`cmd &` in
# a script, some CI runners) starts with SIGINT ignored, and Python keeps it ignored. The stall
# watchdog's --stall-action stop then cannot interrupt the fixtures run in the test process (R104,
# X110) and ends the process instead, which takes the xdist worker with it. (What a user's run
# does in that case is tested in tests/distributed/test_watchdog.py.)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# One intra-op thread in every test process and the processes it starts. A float reduction split
# over N threads adds its partial sums in an order that depends on N (and on the machine's core
# count), and a snapshot prints those digits: pinned, `OMP_NUM_THREADS=4 pytest` and a 2-core CI
# machine print the same text. It is also the fastest setting for `pytest -n 3` on 2 cores (each
# worker's threads would otherwise compete with the other workers').
TEST_THREADS = "1"
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = TEST_THREADS

# Import order guard: with TensorFlow 2.21 and triton in one process, importing triton *after*
# TensorFlow crashes the interpreter (segmentation fault in triton/knobs.py), while the other
# order works. Keras on the torch backend and torch.compile import torch._dynamo, hence triton;
# so every test worker imports it before any test brings TensorFlow in.
with contextlib.suppress(ImportError):
    import torch._dynamo  # noqa: F401
with contextlib.suppress(ImportError):
    import torch

    torch.set_num_threads(int(TEST_THREADS))

    # mp.spawn fixtures run in the test process start their ranks from a warm fork server.
    from tests import warm_spawn

    warm_spawn.install()

# dynamo's recompile limits as torch ships them: a library may change them at import (timm's
# optimizers set cache_size_limit to 1,000,000), which would change what P113 reports for every
# later fixture in the same worker.
_DYNAMO_LIMITS = {name: getattr(sys.modules["torch._dynamo"].config, name)
                  for name in ("recompile_limit", "accumulated_recompile_limit")
                  if "torch._dynamo" in sys.modules and hasattr(sys.modules["torch._dynamo"].config, name)}



def needs(package: str) -> pytest.MarkDecorator:
    """Skip unless ``package`` is installed, without importing it: collection runs in every xdist
    worker, and a module-level ``pytest.importorskip("tensorflow")`` made each of them pay
    TensorFlow's import (~5 s) even when no test of that worker uses it in-process."""
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed")


# A test that runs TensorFlow in the test process: all of them go to one xdist worker (``--dist
# loadgroup``), so one worker imports TensorFlow for them, not every worker. ``pytestmark =
# IN_PROCESS_TENSORFLOW`` for a module, ``@in_process_tensorflow`` for one test.
IN_PROCESS_TENSORFLOW = [needs("tensorflow"), pytest.mark.xdist_group("tensorflow_in_process")]


def in_process_tensorflow(test):
    for mark in IN_PROCESS_TENSORFLOW:
        test = mark(test)
    return test


FIXTURES = Path(__file__).parent / "fixtures"
BUGGY = FIXTURES / "buggy"
CORRECT = FIXTURES / "correct"
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z][0-9]{3}(?:\s*,\s*[A-Z][0-9]{3})*)")


def run_script(path, args=(), *, select=(), ignore=(), max_steps=None, **session_kwargs):
    """Run a training script in this process under a fresh Session; return its Report."""
    from nndoctor.core.engine import Session
    from nndoctor.run.runner import Target, run_target

    # Each script runs as in a fresh process: no torch.compile caches or recompile counts
    # left by an earlier test in this worker (dynamo's limits are process-wide).
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
        for name, value in _DYNAMO_LIMITS.items():
            setattr(dynamo.config, name, value)
    forget_keras_names()
    session = Session(select=select, ignore=ignore, max_steps=max_steps, **session_kwargs)
    cwd = os.getcwd()
    try:
        return run_target(Target(str(path), list(args)), session)
    finally:
        os.chdir(cwd)


def forget_keras_names() -> None:
    """Keras numbers auto-named layers per process ('dense', 'dense_1', ...): start afresh, so
    that a fixture's layer names (which its findings quote) do not depend on the tests before."""
    keras = sys.modules.get("keras")
    if keras is not None:
        keras.backend.clear_session()


def expected_lines(path) -> dict[str, set[int]]:
    """``# expect: CODE`` comments in a fixture: code -> the lines where it must fire."""
    found: dict[str, set[int]] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        match = _EXPECT.search(line)
        if match:
            for code in match.group(1).split(","):
                found.setdefault(code.strip(), set()).add(number)
    return found


def buggy_fixtures(code: str) -> list[Path]:
    return sorted(p for p in BUGGY.glob("*.py") if code in expected_lines(p))


def correct_programs() -> list[Path]:
    return sorted(CORRECT.glob("*.py"))


@pytest.fixture
def run():
    return run_script


# -- torch.compile's kernel cache -------------------------------------------------------------------
# Inductor compiles C++ kernels for the CPU: tests/frameworks' two torch.compile programs took 47
# CPU-seconds (pytest included) with an empty cache directory, 14 with their kernels cached. Tests
# that point TORCHINDUCTOR_CACHE_DIR somewhere share this folder, so only a machine's first run
# pays the compiler. It lives outside the repository (one folder per torch version;
# NNDOCTOR_TEST_INDUCTOR_CACHE moves it), like torch's own default cache (/tmp/torchinductor_USER,
# which the other compiling tests use): a missing or emptied folder only makes the tests slower,
# never changes what they see, since Inductor's cache keys hold the graph, the torch version, the
# configuration and the compiler.
INDUCTOR_CACHE_ENV = "NNDOCTOR_TEST_INDUCTOR_CACHE"


@pytest.fixture(scope="session")
def inductor_cache() -> Path:
    torch_version = getattr(sys.modules.get("torch"), "__version__", "none")
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nndoctor-tests"
    folder = Path(os.environ.get(INDUCTOR_CACHE_ENV) or default / f"inductor-torch-{torch_version}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def pytest_addoption(parser):
    parser.addoption("--snapshot-update", action="store_true", default=False,
                     help="rewrite tests/snapshots/ with what users read now (see tests/snapshot.py)")
    parser.addoption("--record-durations", action="store_true", default=False,
                     help=f"store each test's time in {DURATIONS.name} (which marks tests slow)")


# -- the garbage collector ------------------------------------------------------------------------
# Collection imports torch, TensorFlow, transformers, lightning, ray...: about 900,000 objects that
# the cyclic garbage collector walks on every full collection, 0.7-1.4 s each on a 2-core machine.
# The engine itself runs ``gc.collect()`` at the end of every run once TensorFlow is imported
# (runner.release_stopped_pipelines), so every in-process fixture run paid that second, and
# Python's own full collections paid it too. Frozen, those objects are never walked again: the
# collector sees only what tests create, and their cycles are still collected as before.
def freeze_what_is_loaded() -> None:
    """Collect once, then move every object alive now out of the collector's sight (modules,
    classes and functions of the imported libraries: never garbage). Call it once per process,
    after the imports: cyclic garbage made after it is still collected."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    freeze_what_is_loaded()


# -- slow tests ------------------------------------------------------------------------------------
# The inner loop is ``pytest -m "not slow"``. Which tests are slow is measured, not guessed: a run
# with --record-durations (on a quiet 2-core machine, `pytest -n 2`) stores every test's setup +
# call + teardown seconds in tests/durations.json; a test over SLOW_S there is marked ``slow``, and
# so is every test of a module where one setup took over SLOW_MODULE_SETUP_S (a module-scoped
# subprocess or model: whichever of its tests runs first pays it). Tests missing from the file are
# not marked. SLOW_S is 0.6 s, not 5: the 46 tests of 1 to 5 s (mostly CLI and hostile end-to-end
# runs in subprocesses; 2.7% of the inner loop's tests) recorded 126 of its tests' 244 s, and
# without them the inner loop took half the CPU time (CONTRIBUTING.md); at 1 s the inner loop
# had grown back to 197 s in one process (session 29: 1,817 tests), and the ~100 tests of 0.6 to
# 1 s (-n 2 seconds) held about a quarter of it. Marked by hand (tests/durations.json does not
# know a new test yet): a test over ~5 s.
DURATIONS = Path(__file__).parent / "durations.json"
SLOW_S = 0.6
SLOW_MODULE_SETUP_S = 5.0
_recorded: dict[str, dict[str, float]] = {}


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _plain_id(nodeid: str) -> str:
    """The node id without the ``@group`` suffix xdist's loadgroup adds in its workers (the
    file is keyed by the id a run without xdist sees, so both find a test's entry)."""
    return nodeid.rsplit("@", 1)[0] if "@" in nodeid.rsplit("::", 1)[-1] else nodeid


def pytest_collection_modifyitems(config, items):
    if not DURATIONS.exists():
        return
    import json

    durations = {_plain_id(nodeid): times for nodeid, times in json.loads(DURATIONS.read_text()).items()}
    slow_modules = {module for module, longest in _longest_setups(durations).items() if longest > SLOW_MODULE_SETUP_S}
    for item in items:
        nodeid = _plain_id(item.nodeid)
        if durations.get(nodeid, {}).get("total", 0.0) > SLOW_S or _module_of(nodeid) in slow_modules:
            item.add_marker(pytest.mark.slow)
    _heaviest_modules_first(items, durations)


def _heaviest_modules_first(items: list, durations: dict) -> None:
    """Order the modules by their recorded seconds, heaviest first; a module's tests keep their
    order and stay together (module-scoped fixtures are set up once). ``pytest -n 3`` hands out
    tests in this order (after the ``xdist_group`` modules, which go first): the long tests start
    early and the short ones fill in at the end, so the workers finish together instead of
    one running a 30 s test alone at the end. Every worker sorts the same collection the same
    way, as xdist requires."""
    seconds: dict[str, float] = {}
    for nodeid, times in durations.items():
        seconds[_module_of(nodeid)] = seconds.get(_module_of(nodeid), 0.0) + times.get("total", 0.0)
    first_seen = {}
    for index, item in enumerate(items):
        first_seen.setdefault(_module_of(_plain_id(item.nodeid)), index)
    items.sort(key=lambda item: (-seconds.get(_module_of(_plain_id(item.nodeid)), 0.0),
                                 first_seen[_module_of(_plain_id(item.nodeid))]))


def _longest_setups(durations: dict) -> dict[str, float]:
    longest: dict[str, float] = {}
    for nodeid, times in durations.items():
        module = _module_of(nodeid)
        longest[module] = max(longest.get(module, 0.0), times.get("setup", 0.0))
    return longest


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call", "teardown"):
        _recorded.setdefault(report.nodeid, {})[report.when] = report.duration


def pytest_sessionfinish(session):
    config = session.config
    if not config.getoption("--record-durations") or hasattr(config, "workerinput"):
        return  # the controller (or a run without xdist) writes the file
    import json

    durations = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    durations = {_plain_id(nodeid): times for nodeid, times in durations.items()}
    for nodeid, times in _recorded.items():
        durations[_plain_id(nodeid)] = {"setup": round(times.get("setup", 0.0), 2), "total": round(sum(times.values()), 2)}
    # one test a line: a re-recording reads as a diff of the tests whose time changed
    lines = [f"{json.dumps(nodeid)}: {json.dumps(times)}" for nodeid, times in sorted(durations.items())]
    DURATIONS.write_text("{\n" + ",\n".join(lines) + "\n}\n")


def _refuse_ungrouped_loadgroup() -> None:
    """pytest-xdist 3.8 groups by suffixing ``item._nodeid``, which pytest 9.2's structured node
    ids no longer read (pytest-dev/pytest-xdist#1386): ``xdist_group`` marks are then silently
    ignored, the TensorFlow modules start their shared child on both workers, and the suite takes
    ~2.5 minutes longer. The dev extra pins ``pytest<9.2``; this says why if that pin is lifted
    before xdist has the fix."""
    from importlib.metadata import version

    from packaging.version import Version

    if Version(version("pytest")) >= Version("9.2") and Version(version("pytest-xdist")) < Version("3.9"):
        raise pytest.UsageError(
            f"pytest {version('pytest')} with pytest-xdist {version('pytest-xdist')} ignores xdist_group "
            "marks under --dist loadgroup (pytest-dev/pytest-xdist#1386): install the dev extra's pytest "
            "(pip install -e '.[dev]', pytest<9.2)")


def _compile_sources() -> None:
    """Byte-compile src/ and tests/ once, before any worker or child starts. The suite starts
    ~200 Python processes that import nndoctor (`nndoctor run` children, torchrun and spawned
    ranks, perf re-runs, the TensorFlow child); a fresh clone has no ``__pycache__``, and where
    PYTHONDONTWRITEBYTECODE is set (CI images, this project's machines) no process writes one,
    so each compiled nndoctor's modules again: +0.33 s of CPU a process (163 modules), about a
    minute of CPU a run. ``compileall`` writes the caches whatever that variable says (~1 s, once;
    a no-op when they are current); Python reads them either way. pip does the same for the
    packages it installs; an editable install leaves src/ to us."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    # Not tests/fixtures: those are run as scripts (never cached), and tests read their folders.
    skip = re.compile(re.escape(os.sep + "fixtures" + os.sep))
    for folder in (root / "src", root / "tests"):
        with contextlib.suppress(OSError):  # a read-only checkout only runs slower
            compileall.compile_dir(str(folder), quiet=2, rx=skip, workers=1)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["nndoctor_loadgroup"] = node.config.getvalue("dist") == "loadgroup"


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads --dist and --max-worker-restart
def pytest_configure(config):
    # ``pytest -n N`` distributes with ``loadgroup``: a module marked ``xdist_group`` runs on one
    # worker, so its module-scoped subprocess (the TensorFlow runners) runs once, not per worker.
    # (A worker parses the command line again: it learns it from its workerinput, below.)
    option = getattr(config, "option", None)
    if getattr(option, "dist", None) == "load":
        option.dist = "loadgroup"
    if getattr(option, "dist", None) == "loadgroup" and not hasattr(config, "workerinput"):
        _refuse_ungrouped_loadgroup()
    if getattr(config, "workerinput", {}).get("nndoctor_loadgroup"):
        option.loadgroup = True  # what xdist sets in a worker started with --dist loadgroup
    # A worker that dies (a segfault, the OOM killer) ends the run, naming the test it was running.
    # xdist's default is to replace it, and with --dist loadgroup the replacement hangs the
    # controller forever (pytest-dev/pytest-xdist#1323, #1327: it is re-sent work units whose
    # tests all ran; the fixes are not in a release as of 3.8.0).
    if hasattr(option, "maxworkerrestart") and option.maxworkerrestart is None:
        option.maxworkerrestart = "0"
    if not hasattr(config, "workerinput"):
        _compile_sources()
    # One switch for every way of running the tests (xdist workers inherit the environment).
    if config.getoption("--snapshot-update", default=False):
        from tests.snapshot import UPDATE_ENV

        os.environ[UPDATE_ENV] = "1"
