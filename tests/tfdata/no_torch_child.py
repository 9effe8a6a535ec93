"""Child of test_no_torch.py: a TensorFlow-only environment simulated by an import blocker.

``import torch`` (and torchvision) raise ModuleNotFoundError as if torch were not installed;
then the Keras script runs once as plain Python and once under ``nndoctor run`` (the CLI
entry, in this process). Prints one JSON line: exit status, finding codes and lines, whether
the weights are bit-identical, whether torch got imported."""
import importlib.abc
import json
import os
import runpy
import sys
import tempfile


class BlockTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def main() -> None:
    script = sys.argv[1]
    sys.meta_path.insert(0, BlockTorch())
    folder = tempfile.mkdtemp(prefix="nndoctor-notorch-")
    plain, observed, report = (os.path.join(folder, n) for n in ("plain.npz", "observed.npz", "report.json"))
    saved = sys.argv[:]
    sys.argv = [script, plain]
    runpy.run_path(script, run_name="__main__")
    sys.argv = saved
    from nndoctor.cli import main as cli

    status = cli(["run", "--quiet", "--json", report, script, observed])
    import numpy as np

    a, b = np.load(plain), np.load(observed)
    identical = len(a.files) == len(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)
    with open(report) as handle:
        data = json.load(handle)
    print(json.dumps({
        "status": status, "run_status": data["status"], "identical_weights": identical,
        "findings": [[f["code"], (f.get("location") or {}).get("line"), f["message"]] for f in data["findings"]],
        "internal_errors": data["internal_errors"], "torch_imported": "torch" in sys.modules,
    }))


if __name__ == "__main__":
    main()
