"""Child of test_tf_perf.py: ``nndoctor perf`` on the Keras/TensorFlow fixtures of
``tests/fixtures/perf_tf/``, in one process (TensorFlow's import costs seconds), with ``import torch``
blocked as if torch were not installed. Prints one JSON line: each scenario's perf JSON and
findings, and whether torch got imported."""
import importlib.abc
import json
import os
import sys
import tempfile

SCENARIOS = {
    "input_bound": ["--warmup", "3", "--steps", "10", "--try", "prefetch,parallel-map,channels_last",
                    "--try-repeats", "2", "input_bound_fit.py"],
    "compute_bound": ["--warmup", "3", "--steps", "8", "--try", "amp", "--try-repeats", "2",
                      "compute_bound_fit.py"],
    "custom_loop": ["--warmup", "3", "--steps", "10", "custom_loop.py"],
}


class BlockTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def main() -> None:
    fixtures = sys.argv[1]
    wanted = sys.argv[2:] or list(SCENARIOS)
    sys.meta_path.insert(0, BlockTorch())
    from nndoctor.cli import main as cli

    folder = tempfile.mkdtemp(prefix="nndoctor-tfperf-")
    results = {}
    for name in wanted:
        args = SCENARIOS[name]
        report = os.path.join(folder, f"{name}.json")
        status = cli(["perf", "--quiet", "--json", report, *args[:-1], os.path.join(fixtures, args[-1])])
        with open(report) as handle:
            data = json.load(handle)
        results[name] = {"status": status, "perf": data["extra"]["perf"], "internal_errors": data["internal_errors"],
                         "findings": [[f["code"], (f.get("location") or {}).get("line"), f["message"],
                                       f.get("fix")] for f in data["findings"]]}
    print(json.dumps({"results": results, "torch_imported": "torch" in sys.modules}), flush=True)
    os._exit(0)  # stopped tf.data pipelines with py_functions must not hold the exit


if __name__ == "__main__":
    main()
