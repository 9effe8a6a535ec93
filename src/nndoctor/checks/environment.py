"""Reproducibility, environment and checkpoint files: R101 unseeded randomness, R102 module
shadowing, C104 unsafe checkpoint load, C105 checkpoint I/O overhead."""

from __future__ import annotations

import ast
import importlib.machinery
import os
import sys
import time
from dataclasses import dataclass

import torch

from nndoctor.checks._timing import share_in_halves, timing_severity
from nndoctor.core.events import CheckpointLoad, CheckpointSave, Forward, RunEnd, StepStart
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.user_code import display_path
from nndoctor.instrument.numerics_probe import probe_state


# -- R101 ----------------------------------------------------------------------------------------
@register
class UnseededRandomness(Check):
    """
    ## What it does
    At the first ``optimizer.step()``, reports when the run never seeded PyTorch's global
    generator (``torch.manual_seed``, ``torch.random.manual_seed``, or a helper that calls
    it such as Lightning's ``seed_everything``). nndoctor only observes these calls; it
    never draws a random number itself. Calls to ``random.seed`` and ``numpy.random.seed``
    are listed in the evidence. Under ``nndoctor.watch()`` a process seeded before the
    ``with`` block is recognised from ``torch.initial_seed()``: PyTorch's default seed is
    64 random bits, an explicit seed is almost always below 2**32.

    ## Why is this bad?
    Without a seed, weight initialisation, dropout masks, augmentation and shuffling differ
    on every run: two runs of the same code give different numbers, a regression cannot be
    told from noise, and a NaN at step 3000 cannot be replayed to find its cause . It is information: production training often
    runs unseeded on purpose.

    ## Example
    ```python
    model = Net()
    for x, y in loader:
        ...
    ```

    ## Use instead
    ```python
    import random, numpy as np, torch
    random.seed(0); np.random.seed(0); torch.manual_seed(0)   # before building the model
    ```
    Add ``torch.use_deterministic_algorithms(True)`` for bitwise-reproducible GPU runs.

    ## References
    - PyTorch docs, "Reproducibility": https://pytorch.org/docs/stable/notes/randomness.html
    """

    code = "R101"
    name = "unseeded-randomness"
    severity = Severity.INFO
    summary = "training without fixed seeds"
    fix = "call torch.manual_seed(seed) (and random.seed / numpy.random.seed) before building the model"
    needs = frozenset({"seed_calls"})

    def __init__(self, session) -> None:
        super().__init__(session)
        self._done = False

    def on_step_start(self, event: StepStart) -> None:
        if self._done:
            return
        self._done = True
        self.session.unsubscribe(self, "step_start")  # the first step is all it needs
        seeds = probe_state(self.session).seeds
        if seeds.torch_seeded:
            return
        others = sorted(k for k in seeds.calls if k != "torch")
        also = f" (seeded: {', '.join(others)})" if others else ""
        self.report(
            "Training started without torch.manual_seed" + also + ": initialisation, dropout and "
            "shuffling change on every run, so results cannot be reproduced or a failure replayed.",
            location=event.location,
            evidence={"seeding_calls": dict(seeds.calls)},
            step=event.step,
        )


# -- R102 ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shadowing:
    name: str
    local_path: str
    real_origin: str | None  # where the real module lives ("stdlib" or a path)
    active: bool  # the local file is what `import name` returned in this run


def local_module_names(directory: str) -> dict[str, str]:
    """Importable names defined by the files and packages directly in ``directory``."""
    found: dict[str, str] = {}
    try:
        entries = os.listdir(directory)
    except OSError:
        return found
    for entry in entries:
        path = os.path.join(directory, entry)
        if entry.endswith(".py") and entry[:-3].isidentifier():
            found[entry[:-3]] = path
        elif os.path.isdir(path) and entry.isidentifier() and os.path.exists(os.path.join(path, "__init__.py")):
            found[entry] = path
    return found


def imported_names(script: str) -> dict[str, int]:
    """Top-level module names the script imports, with the line of the first import."""
    try:
        with open(script, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), script)
    except (OSError, SyntaxError, ValueError):
        return {}
    names: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.setdefault(alias.name.split(".")[0], node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.setdefault(node.module.split(".")[0], node.lineno)
    return names


def find_shadowing(directory: str, script_imports: set[str], loaded: dict[str, str | None],
                   real_origin) -> list[Shadowing]:
    """Local files that ``import name`` picks up instead of a stdlib/installed module.

    ``loaded`` maps the run's imported top-level modules to their ``__file__``;
    ``real_origin(name)`` says where the real module lives ("stdlib", a path, or None).

    - A standard-library name counts when the run or the script imports it (an unused
      ``test.py`` shadows nothing; libraries that ``import random`` get the local file too).
    - An installed third-party name counts only when the run uses the real module: a local
      ``utils.py`` the script imports on purpose, beside an unused installed ``utils``, is fine.
    """
    found = []
    directory = os.path.realpath(directory)
    for name, path in sorted(local_module_names(directory).items()):
        if name == "__main__" or (name not in loaded and name not in script_imports):
            continue
        origin = real_origin(name)
        if origin is None:
            continue
        file = loaded.get(name)
        active = bool(file and os.path.realpath(file).startswith(os.path.realpath(path)))
        if origin != "stdlib" and (not file or active):
            continue
        found.append(Shadowing(name, path, origin, active))
    return found


def real_module_origin(name: str, exclude: str) -> str | None:
    """Where the stdlib/installed module ``name`` lives, ignoring the folder ``exclude``."""
    if name in sys.builtin_module_names:
        return None  # built-in modules always win over files: nothing to shadow
    exclude = os.path.realpath(exclude)
    path = [p for p in sys.path if p and os.path.realpath(p) != exclude]
    try:
        spec = importlib.machinery.PathFinder.find_spec(name, path)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return "stdlib" if name in sys.stdlib_module_names else spec.origin


@register
class ModuleShadowing(Check):
    """
    ## What it does
    Once, at the first forward, lists the ``.py`` files and packages in the script's
    folder (the folder Python puts first on ``sys.path``) and flags those named like a
    standard-library or installed module that the run or the script imports — ``pdb.py``,
    ``random.py``, ``torch.py``, ``copy.py`` beside ``train.py``. It points at the script's
    ``import`` line when there is one. Names nothing imports (a ``test.py``) are ignored.

    ## Why is this bad?
    Python imports the local file instead of the real module: ``import pdb`` gets your
    ``pdb.py`` and fails with "module 'pdb' has no attribute 'set_trace'" or "No module
    named …" deep inside a library. Under ``nndoctor run`` the real module may already be loaded, so
    the problem can stay hidden until you run ``python train.py`` again.

    ## Example
    ```
    project/
        train.py        # import random
        random.py       # your helper module
    ```

    ## Use instead
    ```
    project/
        train.py
        random_utils.py
    ```
    (delete the stale ``__pycache__/random.*.pyc`` too).

    ## References
    - Python docs, "The Module Search Path": https://docs.python.org/3/tutorial/modules.html#the-module-search-path
    """

    code = "R102"
    name = "module-shadowing"
    severity = Severity.WARNING
    summary = "a file beside the script shadows a stdlib/installed module (pdb.py, random.py)"
    fix = "rename the local file (and delete its __pycache__ entry) so it does not carry a module's name"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._done = False

    def on_forward(self, event: Forward) -> None:
        self._scan()

    def on_run_end(self, event: RunEnd) -> None:
        self._scan()

    def _scan(self) -> None:
        if self._done:
            return
        self._done = True
        self.session.unsubscribe(self, "forward")  # scanned once, at the first forward
        command = self.session.report.command
        if not command or command[0] == "-m" or not os.path.isfile(command[0]):
            return
        script = os.path.abspath(command[0])
        directory = os.path.dirname(script)
        imports = imported_names(script)
        loaded = {name: getattr(module, "__file__", None)
                  for name, module in list(sys.modules.items()) if "." not in name}
        for item in find_shadowing(directory, set(imports), loaded,
                                   lambda n: real_module_origin(n, directory)):
            line = imports.get(item.name)
            where = Location(display_path(script), line) if line else Location(display_path(item.local_path))
            real = "the standard library" if item.real_origin == "stdlib" else item.real_origin
            state = ("was imported instead of" if item.active else
                     "will be imported instead of (under plain `python`)")
            self.report(
                f"{display_path(item.local_path)} beside the script {state} the module "
                f"{item.name!r} from {real}: `import {item.name}` resolves to the script's folder first.",
                location=where,
                evidence={"module": item.name, "local_file": item.local_path, "real_module": item.real_origin,
                          "shadowing_active": item.active},
            )


# -- C104 ----------------------------------------------------------------------------------------
def weights_only_effective(passed: bool | None, torch_version: str, env: dict[str, str]) -> bool:
    """What ``torch.load`` actually does with ``weights_only`` as passed.

    None means the default: True since PyTorch 2.6, False before; the environment variables
    ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` / ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` override it.
    """
    if env.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0") not in ("0", ""):
        return True
    if passed is not None:
        return bool(passed)
    if env.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0") not in ("0", ""):
        return False
    major, minor = (int(p) for p in torch_version.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 6)


@register
class UnsafeCheckpointLoad(Check):
    """
    ## What it does
    Flags ``torch.load`` calls that unpickle with ``weights_only=False`` — passed
    explicitly, or by default on PyTorch < 2.6, or forced by
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``. Loading a file this run wrote itself with
    ``torch.save`` is reported as info (lower risk); any other file as a warning.

    ## Why is this bad?
    A checkpoint is a pickle: with ``weights_only=False`` loading it can execute arbitrary
    code embedded in the file: model files must be treated as code.
    A checkpoint downloaded from a hub, a colleague or a shared disk can run anything with
    your permissions. ``weights_only=True`` (the default since PyTorch 2.6) only rebuilds
    tensors and plain containers.

    ## Example
    ```python
    state = torch.load("downloaded.pt", weights_only=False)
    ```

    ## Use instead
    ```python
    state = torch.load("downloaded.pt")                    # weights_only=True
    torch.serialization.add_safe_globals([MyConfig])       # allow your own trusted classes
    ```
    ``nndoctor ckpt inspect FILE`` lists what a pickle would import before you load it.

    ## References
    - PyTorch docs, ``torch.load`` (weights_only): https://pytorch.org/docs/stable/generated/torch.load.html
    - Python docs, ``pickle`` security warning: https://docs.python.org/3/library/pickle.html
    """

    code = "C104"
    name = "unsafe-checkpoint-load"
    severity = Severity.WARNING
    summary = "torch.load(weights_only=False) / raw pickle: code execution risk"
    fix = "load with weights_only=True (the default since PyTorch 2.6) and allow trusted classes with torch.serialization.add_safe_globals"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._saved: set[str] = set()

    def on_checkpoint_save(self, event: CheckpointSave) -> None:
        if event.path:
            self._saved.add(os.path.realpath(event.path))

    def on_checkpoint_load(self, event: CheckpointLoad) -> None:
        if weights_only_effective(event.weights_only, torch.__version__, dict(os.environ)):
            return
        own = bool(event.path and os.path.realpath(event.path) in self._saved)
        how = ("weights_only=False" if event.weights_only is False
               else "the default weights_only=False of this PyTorch/environment")
        trust = (" The file was written by this run, so the risk is low." if own else "")
        self.report(
            f"torch.load({repr(event.path) if event.path else '<file object>'}) unpickles with {how}: loading can run "
            f"arbitrary code stored in the file.{trust}",
            location=event.location,
            evidence={"path": event.path, "weights_only": event.weights_only, "written_by_this_run": own},
            severity=Severity.INFO if own else None, step=event.step,
        )


# -- C105 ----------------------------------------------------------------------------------------
def io_overhead_verdict(save_seconds: list[float], wall_s: float, fraction: float,
                        min_saves: int) -> float | None:
    """The fraction of wall time spent saving, when periodic saving exceeds ``fraction``."""
    if len(save_seconds) < min_saves or wall_s <= 0:
        return None
    share = sum(save_seconds) / wall_s
    return share if share > fraction else None


@register
class CheckpointIoOverhead(Check):
    """
    ## What it does
    Adds up the time spent in ``torch.save`` and, at the end of the run, reports when it
    exceeds **10%** of the training wall time (from the first forward to the end, so that
    start-up does not dilute it) with at least 3 saves (a single final save is not overhead
    you can reduce). It points at the save call that took the most time. It is a warning
    only when reproducible: at least 15% (1.5× the threshold) overall and above 10% in each
    half of the training time; a share past 10% without that margin is reported as info.

    ## Why is this bad?
    Time spent writing checkpoints is time the accelerator idles: saving too often slows training; widen the interval. 10% is the point
    where halving the save frequency gives back more than a typical data-loader tweak.

    ## Example
    ```python
    for step, (x, y) in enumerate(loader):
        ...
        torch.save(model.state_dict(), "last.pt")          # every step
    ```

    ## Use instead
    ```python
        if step % 1000 == 0:
            torch.save(model.state_dict(), f"ckpt_{step}.pt")
    ```
    or save from a background thread/process, or to local disk instead of a network share.

    ## References
    - PyTorch tutorial, "Saving and loading a general checkpoint": https://pytorch.org/tutorials/recipes/recipes/saving_and_loading_a_general_checkpoint_for_inference_and_or_resuming_training_in_pytorch.html
    """

    code = "C105"
    name = "checkpoint-io-overhead"
    severity = Severity.WARNING
    summary = "saving checkpoints takes >10% of wall time"
    fix = "save less often (every N steps or epochs), to local disk, or asynchronously"
    FRACTION = 0.10
    MIN_SAVES = 3

    def __init__(self, session) -> None:
        super().__init__(session)
        self._seconds: list[float] = []
        self._finished: list[tuple[float, float]] = []
        self._by_place: dict[Location | None, float] = {}
        self._first_forward: float | None = None

    def on_forward(self, event: Forward) -> None:
        if self._first_forward is None:
            self._first_forward = time.perf_counter()
            self.session.unsubscribe(self, "forward")  # the first one is all it needs

    def on_checkpoint_save(self, event: CheckpointSave) -> None:
        self._seconds.append(event.seconds)
        self._finished.append((time.perf_counter(), event.seconds))
        place = event.location
        self._by_place[place] = self._by_place.get(place, 0.0) + event.seconds

    def on_run_end(self, event: RunEnd) -> None:
        # Training time: from the first forward, so that start-up (imports, dataset indexing)
        # does not dilute the share; the whole wall time when no forward was seen.
        wall = (time.perf_counter() - self._first_forward if self._first_forward is not None
                else event.wall_s)
        share = io_overhead_verdict(self._seconds, wall, self.FRACTION, self.MIN_SAVES)
        if share is None:
            return
        where = max(self._by_place, key=lambda place: self._by_place[place])
        total = sum(self._seconds)
        now = time.perf_counter()
        halves = share_in_halves(self._finished, now - wall, now)
        severity = timing_severity(share, halves, self.FRACTION)
        borderline = ("" if severity == Severity.WARNING else
                      f" Reported as info: not clear of the threshold in both halves of the run "
                      f"({', '.join(f'{h:.0%}' for h in halves or ())}), so another run may measure less.")
        self.report(
            f"{len(self._seconds)} torch.save calls took {total:.2f} s, {share:.0%} of the "
            f"{wall:.2f} s of training (threshold {self.FRACTION:.0%}); about "
            f"{total / len(self._seconds) * 1000:.0f} ms each.{borderline}",
            location=where,
            evidence={"saves": len(self._seconds), "save_seconds": round(total, 4),
                      "training_seconds": round(wall, 4), "fraction": round(share, 4),
                      "halves": [round(h, 4) for h in halves] if halves else None},
            severity=severity, step=event.step,
        )
