"""The Keras doctor in a virtual environment without torch (issue 15): ``python -m venv`` builds
an environment whose only packages are this interpreter's site-packages minus torch, its
companions (torchvision, triton, nvidia, …) and the packages built on it (Lightning, timm,
accelerate), linked one by one into a folder the venv reads through a ``.pth`` file — nothing
copied, so it costs a second, not a 1.5 GB TensorFlow install — and ``nndoctor run`` runs a
Keras script there on the TensorFlow backend. ``import torch`` fails there the way it fails
where torch was never installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests import childproc
from tests.conftest import FIXTURES, needs

pytestmark = needs("tensorflow")
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = FIXTURES / "tfdata" / "keras_tf_backend_fit.py"


# torch, what ships with it, and packages that exist only on top of it.
TORCH_FAMILY = ("functorch", "torchgen", "triton", "nvidia", "lightning", "lightning_utilities", "timm",
                "accelerate")


def _is_torch_family(name: str) -> bool:
    stem = name.split("-")[0].split(".")[0].lower()
    return stem in TORCH_FAMILY or stem.startswith(("torch", "pytorch_", "nvidia_"))


def venv_without_torch(folder: Path) -> Path:
    """A venv that sees every installed package except torch's family; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True, timeout=120)
    packages = folder / "packages"
    packages.mkdir()
    for site_dir in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(site_dir).iterdir():
            if _is_torch_family(entry.name) or entry.suffix == ".pth" or (packages / entry.name).exists():
                continue
            (packages / entry.name).symlink_to(entry)
    python = folder / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "installed_without_torch.pth").write_text(f"{packages}\n")
    return python


@pytest.mark.e2e
@pytest.mark.slow
def test_keras_doctor_runs_without_torch(tmp_path):
    python = venv_without_torch(tmp_path)
    env = {**os.environ, "KERAS_BACKEND": "tensorflow",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = childproc.run([str(python), str(Path(__file__).with_name("no_torch_child.py")), str(SCRIPT)],
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["prefix"] != result["base_prefix"]  # really the venv's interpreter
    assert result["torch_installed"] is False and result["torch_imported"] is False
    assert result["run_status"] == "completed" and result["status"] == 0
    assert result["internal_errors"] == []
    # The TF backend's train function fetches batches eagerly under nndoctor: same weights.
    assert result["identical_weights"] is True
    lines = {code: line for code, line, _ in result["findings"]}
    assert lines.get("K107") == 31 and lines.get("K106") == 36, result["findings"]
