"""Child of test_no_torch.py, run by the interpreter of a virtual environment without torch.

The Keras script runs once as plain Python and once under ``nndoctor run`` (the CLI entry, in
this process). Prints one JSON line: exit status, finding codes and lines, whether the weights
are bit-identical, whether torch could be imported at all and whether it got imported."""
import importlib.util
import json
import os
import runpy
import sys
import tempfile


def main() -> None:
    script = sys.argv[1]
    torch_installed = importlib.util.find_spec("torch") is not None
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
        "torch_installed": torch_installed, "prefix": sys.prefix, "base_prefix": sys.base_prefix,
    }))


if __name__ == "__main__":
    main()
