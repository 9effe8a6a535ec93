"""The commands that need no framework work when torch, torchvision, TensorFlow and Keras
cannot be imported (a Keras-only or a bare installation), and never import them.

One subprocess (importing is per process): it installs a ``sys.meta_path`` finder that makes
those imports fail, then runs each command through the CLI entry in-process.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

from tests import childproc

CHILD = textwrap.dedent(r'''
    import contextlib, io, json, sys
    from importlib.abc import MetaPathFinder

    BLOCKED = {"torch", "torchvision", "tensorflow", "keras"}

    class NoFrameworks(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, NoFrameworks())

    import numpy as np
    from PIL import Image

    work = sys.argv[1]
    for label, colour in (("cat", (200, 40, 40)), ("dog", (40, 40, 200))):
        folder = f"{work}/images/{label}"
        __import__("os").makedirs(folder)
        for i in range(3):
            Image.new("RGB", (24, 24), tuple(c + 10 * i for c in colour)).save(f"{folder}/{i}.png")

    from safetensors.numpy import save_file
    save_file({"module.fc.weight": np.ones((2, 3), np.float32), "module.fc.bias": np.zeros(2, np.float32)},
              f"{work}/wrapped.safetensors")
    import h5py
    with h5py.File(f"{work}/model.weights.h5", "w") as h5:
        kernel = np.ones((3, 2), np.float32)
        kernel[0, 0] = np.nan
        h5.create_dataset("layers/dense/vars/0", data=kernel)
        h5.create_dataset("layers/dense/vars/1", data=np.zeros(2, np.float32))
    with open(f"{work}/good.toml", "w") as f:
        f.write('[tool.nndoctor]\nselect = ["M101", "D1", "F101"]\nignore = ["eval-in-train-mode"]\n')
    with open(f"{work}/bad.toml", "w") as f:
        f.write('[tool.nndoctor]\nignore = ["M101", "no-such-check"]\n')

    from nndoctor.cli import main

    COMMANDS = {
        "help": ["--help"],
        "checks": ["checks"],
        "checks-torch-code": ["checks", "M101"],
        "checks-keras-code": ["checks", "K101"],
        "explain": ["explain", sys.argv[2]],
        "data": ["data", f"{work}/images", "--select", "F113,M101", "--no-cache"],
        "ckpt-safetensors": ["ckpt", "inspect", f"{work}/wrapped.safetensors"],
        "ckpt-h5": ["ckpt", "inspect", f"{work}/model.weights.h5"],
        "ckpt-tf": ["ckpt", "inspect", sys.argv[3]],  # a TensorFlow checkpoint folder
        "config-ok": ["data", f"{work}/images", "--config", f"{work}/good.toml", "--no-cache"],
        "config-bad": ["data", f"{work}/images", "--config", f"{work}/bad.toml", "--no-cache"],
        "run-help": ["run", "--help"],
    }
    results = {}
    for name, argv in COMMANDS.items():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as stop:  # --help
                rc = stop.code
            except BaseException as error:
                rc = f"raised {type(error).__name__}: {error}"
        results[name] = {"rc": rc, "out": out.getvalue(), "err": err.getvalue()}
    results["imported"] = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
    print("RESULTS" + json.dumps(results))
''')


def test_commands_without_any_framework(tmp_path):
    log = Path(__file__).parent / "explain" / "pasted" / "backtick_oom_no_space.txt"
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}
    tf_checkpoint = Path(__file__).parent / "ckpt" / "fixtures" / "tf_small"
    done = childproc.run([sys.executable, "-c", CHILD, str(tmp_path), str(log), str(tf_checkpoint)], timeout=300,
                         env=env, cwd=tmp_path)
    marker = next((line for line in done.stdout.splitlines() if line.startswith("RESULTS")), None)
    assert marker is not None, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(marker[len("RESULTS"):])
    assert results.pop("imported") == []

    def ran(name: str, rc: int) -> str:
        result = results[name]
        assert result["rc"] == rc, f"{name}: {result}"
        assert "Traceback" not in result["out"] + result["err"], f"{name}: {result}"
        return result["out"] + result["err"]

    assert "ckpt" in ran("help", 0)
    listing = ran("checks", 0)
    for code in ("M101", "E108", "F101", "C104", "K101", "V101", "H101"):  # torch, Keras and light families
        assert f"\n{code}  " in "\n" + listing, code
    torch_doc = ran("checks-torch-code", 0)
    assert "## What it does" in torch_doc and "model.eval()" in torch_doc
    assert "checks/modes.py:" in torch_doc and "(EvalInTrainMode)" in torch_doc
    assert "from_logits" in ran("checks-keras-code", 0)
    assert "E108" in ran("explain", 0)  # explaining a log succeeds: the crash is the user's
    data = ran("data", 0)
    assert "F113" in data and "F101" not in data
    shared = ran("ckpt-safetensors", 0)  # C101 is a runtime check's code, reported from the table
    assert "C101" in shared and "wrapper-prefix-in-checkpoint" in shared
    assert "C209" in ran("ckpt-h5", 1)
    assert "net/dense/bias" in ran("ckpt-tf", 1)  # C209, read without TensorFlow
    # Runtime codes and names are valid in a shared configuration; select keeps F113 out.
    assert "F113" not in ran("config-ok", 0)
    assert "no-such-check" in ran("config-bad", 2) and "M101" not in results["config-bad"]["err"]
    assert "--max-steps" in ran("run-help", 0)
