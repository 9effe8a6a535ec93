"""One TensorFlow process for the test modules that need Keras on the TensorFlow backend.

This session imports Keras on its torch backend (tests/conftest.py) and Keras fixes its backend at
its first import, so these modules get their data from a child process. Each used to start its
own, and each child paid the same start: Python, ``tests.conftest`` (torch and torch._dynamo,
~3 s of CPU) and TensorFlow with Keras (~5 s). Here ONE child (``python -m tests.tf_process OUT
PART...``) makes the data of every module of ``PARTS`` that the session collected, each part in
its folder under OUT, and the modules read it from there:

- ``checkpoints``: the TensorFlow checkpoints and SavedModels of tests/ckpt/test_tf_checkpoint.py
  (``tests/ckpt/tf_checkpoint_builder.py``);
- ``backend``: every Keras fixture on the TensorFlow backend (``tests/keras/tf_backend_runner.py``);
- ``crashes``: the TensorFlow crash fixtures under the engine (``tests/explain/tf_crash_runner.py``);
- ``data_order``: the batches a Keras fit sees with and without nndoctor
  (``tests/tfdata/keras_order_child.py``).

The modules share one ``xdist_group`` (``GROUP``), so ``pytest -n`` runs them on one worker and the
child runs once. A part that raised is reported by its own module's tests, not by the others'.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GROUP = "tensorflow_process"
# Test module (its node id's path) -> the part of the child that makes its data.
PARTS = {"tests/ckpt/test_tf_checkpoint.py": "checkpoints", "tests/keras/test_tf_backend.py": "backend",
         "tests/explain/test_tf_crashes.py": "crashes", "tests/tfdata/test_keras_data_order.py": "data_order"}
# The order they run in: the checkpoints first, while Keras's layer-name counters are fresh (the
# builder records the weights' paths, which hold the names).
ORDER = ("checkpoints", "backend", "crashes", "data_order")
ERROR = "error.txt"
TIMEOUT_S = 1200  # scaled to the machine's load by childproc

_folders: dict[str, Path] = {}


def part_folder(request: Any, part: str) -> Path:
    """The folder holding ``part``'s data; the child runs on the first call, for every part the
    session collected (so a run of one module makes that module's part only)."""
    if part not in _folders:
        from tests import childproc

        collected = {item.nodeid.split("::")[0] for item in request.session.items}
        wanted = {PARTS[module] for module in collected if module in PARTS} | {part}
        parts = [name for name in ORDER if name in wanted and name not in _folders]
        out = request.getfixturevalue("tmp_path_factory").mktemp("tf_process")
        env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2",
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH"))
                                             if p)}
        done = childproc.run([sys.executable, "-m", "tests.tf_process", str(out), *parts], cwd=ROOT, env=env,
                             timeout=TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-4000:]
        for name in parts:
            _folders[name] = out / name
    folder = _folders[part]
    assert not (folder / ERROR).exists(), (folder / ERROR).read_text()
    return folder


def read_json(request: Any, part: str) -> Any:
    """``part``'s ``results.json``."""
    return json.loads((part_folder(request, part) / "results.json").read_text())


# -- the child ---------------------------------------------------------------------------------
def _write(folder: Path, data: Any) -> None:
    (folder / "results.json").write_text(json.dumps(data, default=str))


def _checkpoints(folder: Path) -> None:
    from tests.ckpt import tf_checkpoint_builder

    tf_checkpoint_builder.main(str(folder))


def _backend(folder: Path) -> None:
    from tests.keras import tf_backend_runner

    _write(folder, tf_backend_runner.results())


def _crashes(folder: Path) -> None:
    from tests.explain import tf_crash_runner

    _write(folder, tf_crash_runner.results(tf_crash_runner.fixtures()))


def _data_order(folder: Path) -> None:
    from tests.tfdata import keras_order_child

    _write(folder, keras_order_child.cases())


RUNNERS = {"checkpoints": _checkpoints, "backend": _backend, "crashes": _crashes, "data_order": _data_order}


def main(out: str, parts: list[str]) -> None:
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import importlib

    if set(parts) - {"checkpoints"}:  # the builder alone needs neither torch nor nndoctor
        # tests.conftest first: it imports torch._dynamo, hence triton, before TensorFlow (the
        # other order segfaults); then what the parts import, to be frozen with the rest.
        from tests.conftest import freeze_what_is_loaded

        for name in ("keras", "tensorflow", "nndoctor.core.engine", "nndoctor.run.runner"):
            importlib.import_module(name)
        freeze_what_is_loaded()  # each run's gc.collect() then walks only what the parts made
    for part in parts:
        folder = Path(out) / part
        folder.mkdir(parents=True)
        try:
            RUNNERS[part](folder)
        except BaseException:  # noqa: BLE001 - reported by the part's own tests
            (folder / ERROR).write_text(traceback.format_exc())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
